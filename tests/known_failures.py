"""The ONE list of contract checks a variant is known to fail, with where the fix is.

Every case is ``xfail(strict=True)``: when a fix lands, the test XPASSes, the suite fails, and the
entry must be deleted here. Keys are ``(check, variant)``; checks are named in the contract tests
(``tests/attention/test_attention_contract.py``, ``test_fuzz_attention.py``, ``test_pooling_reach.py``,
``test_attention_bf16.py``).
"""
from __future__ import annotations

import pytest

from attention.registry import variant_names

KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def variant_cases(check: str, names: list[str] | None = None) -> list:
    """``pytest.param`` per variant, the known failures of ``check`` marked strict xfail."""
    params = []
    for name in names if names is not None else variant_names():
        reason = KNOWN_FAILURES.get((check, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params
