"""``python run.py mode=check attention=<name>`` (lra/checks/variant.py): every property holds for
softmax; a variant that ignores the key mask fails, and the failure names padding, in words, with
its magnitude; the command exits 1 on a failure and 0 otherwise."""
from __future__ import annotations

from functools import partial

import pytest

from lra.checks.contract import NamedFactory, factory
from lra.checks.variant import Outcome, run_properties, table
from tests.planted_variants import IgnoresKeyMask

PLANTED = NamedFactory("ignores_key_mask", lambda **settings: partial(IgnoresKeyMask, **settings))


def test_softmax_holds_every_property() -> None:
    outcomes = run_properties(NamedFactory("softmax", factory("softmax", small=True)), compile=False)
    assert [o.prop for o in outcomes if o.problem] == []
    assert len(outcomes) == 10


def test_a_variant_that_ignores_the_key_mask_fails_on_padding() -> None:
    failed = {o.prop: o.problem for o in run_properties(PLANTED, compile=False) if o.problem}
    assert {"padding invariance (eval)", "padding invariance (train)", "every token reaches the logits"} <= failed.keys()
    assert "padding leaks" in failed["padding invariance (eval)"] and "key mask" in failed["padding invariance (eval)"]
    assert "padded tokens reach the logits" in failed["every token reaches the logits"]
    # the fully padded row, determinism, gradients and the precisions are not what this bug breaks
    assert "fully padded rows" not in failed and "determinism" not in failed


def test_the_table_says_which_failed_and_why() -> None:
    text = table("mine", [Outcome("determinism", None, 0.1), Outcome("padding invariance (eval)", "padding leaks", 0.2)],
                 [("compiled step matches eager", "check.compile=false")])
    lines = text.splitlines()
    assert lines[2].startswith("determinism") and " pass " in lines[2]
    assert "FAIL" in lines[3] and lines[4].strip() == "padding leaks"
    assert "skip" in lines[5] and "check.compile=false" in lines[5]
    assert lines[-1].startswith("1 of 2 properties hold; 1 failed")


def test_an_exception_is_the_property_s_failure() -> None:
    class Raises(IgnoresKeyMask):
        def forward(self, q, k, v, mask, x):  # noqa: ANN001
            raise RuntimeError("shapes do not line up")

    outcomes = run_properties(NamedFactory("raises", lambda **s: partial(Raises, **s)), compile=False)
    assert all(o.problem and "RuntimeError: shapes do not line up" in o.problem for o in outcomes)


@pytest.mark.slow  # two run.py processes (forked) and one aot_eager compile: about 10 s
def test_run_py_mode_check(cli) -> None:
    ok = cli("mode=check", "attention=softmax")
    assert ok.returncode == 0 and "11 of 11 properties hold" in ok.stdout
    bad = cli("mode=check", "attention._target_=tests.planted_variants.IgnoresKeyMask", "check.compile=false",
              check=False)
    assert bad.returncode == 1, bad.stderr
    assert "attention=tests.planted_variants.IgnoresKeyMask" in bad.stdout
    assert "padding invariance (eval)       FAIL" in bad.stdout and "padding leaks" in bad.stdout
    # a sweep checks every variant: a failing one fails its job, the others go on
    sweep = cli("-m", "mode=check", "attention=softmax,linear", "check.compile=false", check=False)
    assert sweep.returncode == 0 and sweep.stdout.count("10 of 10 properties hold") == 2, sweep.stdout[-2000:]


@pytest.mark.slow  # 28 configs, about 6 s
def test_every_shipped_config_passes_the_check():
    """The check holds a variant to what the suite holds every config to: all of them pass it
    (the compiled step apart: tests/attention/test_graph_safe.py compiles every config)."""
    from attention.registry import variant_names

    failed = {n: [o.prop for o in run_properties(NamedFactory(n, factory(n, small=True), factory(n)), compile=False)
                  if o.problem] for n in variant_names()}
    assert {n: f for n, f in failed.items() if f} == {}
