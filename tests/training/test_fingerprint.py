"""A run knows what its code does: the behavioural fingerprint (:mod:`lra.training.fingerprint`)
and the rules that compare two (:func:`lra.identity.behaviour_difference`). Fast, no subprocess;
the runs through run.py that rely on it are in test_fingerprint_runs.py."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

import attention.softmax as softmax
from attention.registry import CONF_DIR
from lra.identity import BEHAVIOUR_ATOL, BEHAVIOUR_RTOL, behaviour_difference
from lra.training.fingerprint import LOGITS, STEPS, VERSION, behavioural_fingerprint, canonical_batch
from lra.training.train import build_module
from tests.conftest import TINY_LISTOPS

MODEL = [o for o in TINY_LISTOPS if o.startswith(("model=", "task.max_len"))]


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*MODEL, "attention_name=x", *overrides])
    with open_dict(cfg):
        cfg.model.dropout = 0.1  # dropout on: the fingerprint must still be reproducible
    return cfg


def fingerprint(*overrides: str) -> dict:
    return behavioural_fingerprint(config(*overrides), build_module)


@pytest.fixture(scope="module")
def clean() -> dict:
    return fingerprint()


def test_the_canonical_batch_is_fixed_and_padded():
    one, two = canonical_batch(17, 10, 64), canonical_batch(17, 10, 64)
    assert torch.equal(one["ids"], two["ids"]) and one["mask"][0].all() and not one["mask"][1].all()
    assert (one["ids"][~one["mask"]] == 0).all() and (one["ids"][one["mask"]] > 0).all()
    dual = canonical_batch(257, 2, 32, dual=True)
    assert dual["ids"].shape == (2, 2, 32) and dual["mask"][1, 0].all() and not dual["mask"][1, 1].all()


def test_the_fingerprint_is_reproducible_and_leaves_the_random_states_alone(clean):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = fingerprint()
    assert torch.equal(torch.get_rng_state(), before)
    assert first == clean
    assert first["version"] == VERSION and len(first["losses"]) == STEPS and len(first["logits"]) == LOGITS
    assert first["losses"][1] < first["losses"][0]  # the steps moved the weights


def test_every_seed_of_an_experiment_shares_its_fingerprint():
    """Even where the build reads the config's seed (a variant whose YAML follows ``${seed}``)."""
    def seeded_build(cfg):
        torch.manual_seed(int(cfg.seed))
        return build_module(cfg)

    assert behavioural_fingerprint(config("seed=3"), seeded_build) == behavioural_fingerprint(config(), seeded_build)


def test_the_thread_count_is_not_a_difference(clean):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = fingerprint()
    finally:
        torch.set_num_threads(threads)
    assert behaviour_difference(two, clean) is None


def _no_key_mask(monkeypatch):
    monkeypatch.setattr(softmax, "key_bias", lambda mask, dtype: None)
    monkeypatch.setattr(softmax, "zero_padded", lambda out, pad: out)


def _no_scale(monkeypatch):
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(softmax.F, "scaled_dot_product_attention", lambda q, k, v, **kw: sdpa(q, k, v, scale=1.0, **kw))


def _flipped_sign(monkeypatch):
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(softmax.F, "scaled_dot_product_attention", lambda q, k, v, **kw: sdpa(-q, k, v, **kw))


def _detached_values(monkeypatch):
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(softmax.F, "scaled_dot_product_attention", lambda q, k, v, **kw: sdpa(q, k, v.detach(), **kw))


def explicit_attention(q, k, v, attn_mask=None, dropout_p=0.0, **kw):
    """softmax(q k^T / sqrt(d) + bias) v written out: the same numbers as the fused kernel, summed
    in another order (dropout 0, as the variant's default)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores if attn_mask is None else scores + attn_mask, dim=-1) @ v


def _equivalent(monkeypatch):  # a refactor: the same numbers by another path
    monkeypatch.setattr(softmax.F, "scaled_dot_product_attention", explicit_attention)


@pytest.mark.parametrize("bug", [_no_key_mask, _no_scale, _flipped_sign, _detached_values])
def test_a_planted_bug_changes_the_fingerprint(bug, monkeypatch, clean):
    bug(monkeypatch)
    said = behaviour_difference(fingerprint(), clean)
    assert said is not None and "against" in said, f"{bug.__name__}: the fingerprint did not see it"


def test_a_refactor_that_keeps_the_numbers_keeps_the_fingerprint(monkeypatch, clean):
    _equivalent(monkeypatch)
    refactored = fingerprint()
    assert refactored != clean  # another path: not bit-identical ...
    assert behaviour_difference(refactored, clean) is None  # ... but the same behaviour


def test_the_comparison_rules():
    fp = {"version": VERSION, "losses": [2.0, 1.5], "logits": [1.0, -0.5]}
    assert behaviour_difference(fp, None) is None and behaviour_difference(None, fp) is None  # nothing says it differs
    near = {**fp, "logits": [1.0 + BEHAVIOUR_RTOL / 2, -0.5]}
    assert behaviour_difference(near, fp) is None
    far = {**fp, "logits": [1.0 + 10 * (BEHAVIOUR_ATOL + BEHAVIOUR_RTOL), -0.5]}
    assert behaviour_difference(far, fp) == "logit 0: 1.0011 against 1"
    assert behaviour_difference(fp, {**fp, "losses": [2.1, 1.5]}) == "training loss of step 1: 2 against 2.1"
    assert "version" in behaviour_difference({**fp, "version": VERSION + 1}, fp)
    assert "logits" in behaviour_difference({**fp, "logits": [1.0]}, fp)
