"""An attention variant's settings are checked against its class's signature before any work
(lra/checks/variant_settings.py): one clause per bad setting naming the key, the value, what is
expected (from the type hints) and an example (the config's value); every shipped config passes."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from attention.registry import CONF_DIR, variant_names
from lra.badinput import ConfigError
from lra.checks.variant_settings import check_variant_settings, expectation


def composed(name: str, **settings) -> OmegaConf:
    attention = OmegaConf.merge(OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml"), settings)
    return OmegaConf.create({"attention": attention, "attention_name": name})


@pytest.mark.parametrize("name", variant_names())
def test_every_shipped_config_passes(name: str) -> None:
    check_variant_settings(composed(name))


@pytest.mark.parametrize("name, settings, expected", [
    ("linear", {"eps": "tiny"}, "attention.eps='tiny' is invalid: it must be a number (LinearAttention's eps), "
                                "e.g. attention.eps=1e-06."),
    ("adamra", {"rates": 0.5}, "attention.rates=0.5 is invalid: it must be a list of numbers (AdaMRAAttention's "
                               "rates), e.g. attention.rates=[0.5,0.125,0.03125]."),
    ("adamra", {"rates": [0.5, "x"]}, "attention.rates=[0.5, 'x'] is invalid: it must be a list of numbers"),
    ("bigbird", {"block_size": 2.5}, "attention.block_size=2.5 is invalid: it must be a whole number "
                                     "(BigBirdAttention's block_size), e.g. attention.block_size=64."),
    ("sparse", {"stride": "x"}, "attention.stride='x' is invalid: it must be a whole number or null"),
    ("linformer", {"share_kv": 1}, "attention.share_kv=1 is invalid: it must be true or false"),
    ("memformer", {"memory": 3}, "attention.memory=3 is invalid: it must be a string"),
    ("linear", {"epss": 1.0}, "unknown setting attention.epss: attention.linear.LinearAttention has no parameter "
                              "'epss'; did you mean attention.eps?"),
])
def test_a_bad_setting_is_named_with_its_rule_and_an_example(name: str, settings: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_variant_settings(composed(name, **settings))
    assert str(raised.value).startswith(expected)
    assert "\n" not in str(raised.value)


def test_every_problem_at_once() -> None:
    with pytest.raises(ConfigError, match=r"attention.stride='x' .*; attention.summary=1.5 is invalid"):
        check_variant_settings(composed("sparse", stride="x", summary=1.5))


def test_nullable_and_nested_objects_pass() -> None:
    check_variant_settings(composed("sparse", stride=None))      # int | None
    check_variant_settings(composed("abc_mlp"))                   # tie: a nested _target_ object


def test_the_rules_come_from_the_type_hints() -> None:
    from typing import Sequence

    test, words = expectation(Sequence[float])
    assert words == "a list of numbers" and test([1, 0.5]) and not test(0.5) and not test(["a"])
    test, words = expectation(int | None)
    assert words == "a whole number or null" and test(None) and test(3) and not test(True) and not test(2.5)


def test_a_class_of_ones_own_is_told_which_inherited_setting_to_drop():
    cfg = composed("softmax")
    cfg.attention._target_ = "tests.planted_variants.IgnoresKeyMask"   # takes dropout: passes
    check_variant_settings(cfg)
    cfg.attention._target_ = "attention.linear.LinearAttention"          # has no dropout
    with pytest.raises(ConfigError, match=r"unknown setting attention.dropout: attention.linear.LinearAttention has no "
                                          r"parameter 'dropout' \(it comes from conf/attention/softmax.yaml, written for "
                                          r"attention.softmax.SoftmaxAttention; drop it with ~attention.dropout\)"):
        check_variant_settings(cfg)
