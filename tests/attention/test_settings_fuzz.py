"""The settings a user may choose, beyond the grid's tables: the valid ranges are the ones the
constructors (and lra/checks/config.py) check, the grid and the fuzz stay inside them, and a
hypothesis fuzz over configs draws settings from those ranges for the cheap variants and compares
them with the float64 references in values and gradients (the grid's checks, on drawn points).
Derandomised with no example database: the same examples on every run, so it never flakes."""
from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attention.registry import variant_names
from lra.checks.config import RULES
from tests.attention.allpairs import all_pairs
from tests.attention.settings_grid import (FAMILIES, HEAD_DIM, RANGES, SHAPE, Point, Range, config_values, factors,
                                           family_of, grid, row_lengths)
from tests.attention.test_reference_grid import CHECKS, check_baseline
from tests.attention_harness import make_mixer

# Cheap enough at fuzz sizes (memformer's reference runs a whole encoder: the grid covers it).
FUZZED = [f for f in FAMILIES if f != "memformer"]


# ----------------------------------------------------------------------------- the grid generator
def test_all_pairs_covers_every_allowed_pair_in_fewer_rows_than_the_product():
    fs = {"a": (1, 2, 3), "b": ("x", "y"), "c": (0, 1, 2, 3), "d": (True, False), "e": (5, 6, 7)}
    allowed = lambda r: not (r.get("a") == 3 and r.get("d") is False)  # noqa: E731
    rows = all_pairs(fs, allowed)
    assert all(allowed(r) for r in rows)
    for f, g in combinations(fs, 2):
        for u in fs[f]:
            for v in fs[g]:
                if allowed({f: u, g: v}):
                    assert any(r[f] == u and r[g] == v for r in rows), (f, u, g, v)
    assert 12 <= len(rows) < 3 * 2 * 4 * 2 * 3 / 4
    assert rows == all_pairs(fs, allowed)                      # deterministic


def test_every_config_has_a_grid_over_every_setting_it_exposes():
    """Every key of every conf/attention/*.yaml has a table (factors() raises otherwise), every
    family's table values are valid, and the grid of each config runs every shape setting."""
    for config in variant_names():
        fs = factors(config)
        assert set(config_values(config)) <= set(fs)
        points = grid(config)
        assert {p.heads for p in points} == set(SHAPE["heads"]), config
        assert {p.train for p in points} == {True, False}, config
        kinds = {p.lengths for p in points}
        assert any(len(set(k)) > 1 and 0 in k for k in kinds), f"{config}: no ragged batch with an empty row"
        assert any(p.n == p.max_len for p in points) or "max_len" not in FAMILIES[family_of(config)].shape
        assert any(p.n < p.max_len and p.max_len % p.n for p in points) or config == "memformer"


def test_grid_tables_hold_valid_values_and_move_decays_and_temperatures_off_symmetric_ones():
    for family, fam in FAMILIES.items():
        for key, values in fam.tables.items():
            if key in RANGES[family]:
                for v in values:
                    _assert_inside(RANGES[family][key], v, f"{family}.{key}")
    for family, key in (("routing", "decay"), ("sinkhorn", "temperature")):
        values = FAMILIES[family].tables[key]
        assert any(v not in (0.5, 1.0) for v in values) and 0.5 not in values, (family, key, values)


def _assert_inside(r: Range, v, what: str) -> None:
    if v is None:
        assert r.nullable, what
        return
    for x in (v if r.kind == "rates" else [v]):
        assert x > r.low if r.low_open else x >= r.low, (what, v)
        if r.high is not None:
            assert x < r.high if r.high_open else x <= r.high, (what, v)
    if r.kind == "odd":
        assert v % 2 == 1, (what, v)


# ----------------------------------------------------------------------------- ranges = the validation
def _build(family: str, key: str, value) -> None:
    config = FAMILIES[family].configs[0]
    make_mixer(config, n_heads=2, head_dim=HEAD_DIM, max_len=16, **{key: value})


@pytest.mark.parametrize("family,key", [(f, k) for f in RANGES for k in RANGES[f]])
def test_ranges_are_what_the_validation_accepts(family, key):
    """The ends of each range are accepted and the values just outside refused, with an error
    naming the setting (so the fuzz and the grid draw from exactly what a user may choose)."""
    r = RANGES[family][key]
    inside = [[x] if r.kind == "rates" else x for x in r.inside()]
    if (family, key) == ("softmax", "dropout"):   # checked by the run's config validation
        rule = next(rule for rule in RULES if rule.key == "attention.dropout")
        assert all(rule.problem(v) is None for v in inside)
        assert all(rule.problem(v) for v in r.outside())
        return
    for v in inside:
        _build(family, key, v)
    for v in r.outside():
        with pytest.raises(ValueError, match=key if key != "rates" else "rates"):
            _build(family, key, v)


@pytest.mark.parametrize("family,key", [(f, k) for f in FAMILIES for k, vs in FAMILIES[f].tables.items()
                                        if all(isinstance(v, str) for v in vs)])
def test_choices_outside_the_documented_ones_are_refused(family, key):
    with pytest.raises(ValueError, match=key.split("_")[0]):
        _build(family, key, "bogus")


# ----------------------------------------------------------------------------- the fuzz over configs
def _value(r: Range):
    lo, hi = r.draw
    if r.kind == "rates":
        base = st.lists(st.floats(lo, hi), min_size=1, max_size=4).map(tuple)
    elif r.kind == "float":
        base = st.floats(lo, hi)
    elif r.kind == "odd":
        base = st.integers((int(lo) - 1) // 2, (int(hi) - 1) // 2).map(lambda i: 2 * i + 1)
    else:
        base = st.integers(int(lo), int(hi))
    return st.one_of(st.none(), base) if r.nullable else base


@st.composite
def points(draw, family: str) -> Point:
    """A point of the family's first config: numeric settings from their valid ranges, choices and
    switches from the grid's tables, shapes from small ranges."""
    fam = FAMILIES[family]
    config = fam.configs[0]
    heads = draw(st.sampled_from(SHAPE["heads"]))
    over = {}
    for key in config_values(config):
        if key in RANGES[family]:
            r = RANGES[family][key]
            if key == "local_heads":
                r = Range("int", 0, nullable=True, draw=(0, heads))
            over[key] = draw(_value(r))
        else:
            over[key] = draw(st.sampled_from(fam.tables[key]))
    if "rates" in over:
        over["rates"] = list(over["rates"])
    n = draw(st.integers(1, 12 if family in ("routing", "clustered") else 24))
    max_len = n + draw(st.integers(0, 12))
    rows = draw(st.lists(st.integers(0, n), min_size=1, max_size=3))
    train = draw(st.booleans())
    extra = {k: draw(st.sampled_from(v)) for k, v in fam.extra.items()}
    return Point(config, over, heads, n, max_len, tuple(rows), train, extra)


@pytest.mark.slow
@pytest.mark.parametrize("family", FUZZED)
@settings(max_examples=20, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_configs_against_the_references(family, data):
    point = data.draw(points(family), label="point")
    assume(not (family == "softmax" and point.train and point.overrides["dropout"] > 0))  # dropout draws
    try:
        CHECKS.get(family, check_baseline)(point)
    except AssertionError as e:
        raise AssertionError(f"fuzz point {point.describe()}:\n{e}") from None

