"""The contract checks a variant is known to fail, with where the fix is: each class's
``spec.known_failures`` (attention/spec.py; ``{check: reason}``, per config through ``spec.configs``).

Every case is ``xfail(strict=True)``: when a fix lands, the test XPASSes, the suite fails, and the
entry must be deleted from the spec. Checks are named in the contract tests
(``tests/attention/test_attention_contract.py``, ``test_fuzz_attention.py``, ``test_pooling_reach.py``,
``test_attention_bf16.py``).
"""
from __future__ import annotations

import pytest

from attention.registry import variant_names
from attention.spec import spec_of, spec_problem


def known_failure(check: str, name: str) -> str | None:
    """The reason ``name`` is known to fail ``check``, or None (also for a config whose spec is
    incomplete: tests/attention/test_specs.py names what it lacks)."""
    return None if spec_problem(name) else spec_of(name).known_failures.get(check)


def variant_cases(check: str, names: list[str] | None = None) -> list:
    """``pytest.param`` per variant, the known failures of ``check`` marked strict xfail."""
    params = []
    for name in names if names is not None else variant_names():
        reason = known_failure(check, name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params
