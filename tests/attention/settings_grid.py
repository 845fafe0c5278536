"""The settings grid of the reference tests: for every attention config, a small table of
interesting values for every hyperparameter its YAML exposes and for every setting that changes a
code path (heads, the sequence length against ``max_len`` and against the block, chunk, window or
segment it is cut into, padded rows, train or eval, layers, repeated training calls), crossed
pairwise (:func:`tests.attention.allpairs.all_pairs`), not as the full product.

Tables hold values at, below and above the sizes they interact with (kernels wider than their
block, one bucket, one cluster, clusters and windows larger than the sequence), the ends of the
valid ranges (decay 0 and 1, iterations 0, no random blocks) and decays and temperatures away
from symmetric values such as 0.5. A table's first value is the default: a config whose value
differs keeps its own (it is what makes it that config) and varies the rest. The tables, ``unit``
and ``allowed`` are the class's ``spec.grid`` (attention/spec.py), written next to the class; a
family is a class (its spec's ``family`` name, else its module's), with every config that targets it.

``RANGES`` (each spec's ``ranges``) writes down the valid range of every numeric hyperparameter as
the constructors (and, for ``dropout``, lra/checks/config.py) check it; tests/attention/test_settings_fuzz.py tests that
they accept the ends and refuse the values just outside, that every table value lies inside, and
draws the hypothesis fuzz over configs from these ranges.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Mapping

from attention.registry import variant_names
from attention.spec import Range, class_of, complete_configs, config_values, family_of, spec_of, where
from tests.attention.allpairs import all_pairs

HEAD_DIM = 4
TIMES: dict[str, list[float]] = defaultdict(list)     # seconds per grid point run, by config
HYDRA = {"_target_", "_partial_"}
SHAPE = {
    "heads": (1, 2, 4),
    "n": ("below", "at", "multiple", "ragged"),       # N against the family's unit (block, chunk, ...)
    "max_len": ("n", "above"),                         # max_len = N, or above and no multiple of it
    "rows": ("full", "ragged", "short"),               # real lengths of the batch's rows
    "mode": ("train", "eval"),
}


@dataclass(frozen=True)
class Family:
    """One attention class's grid (its spec's :class:`attention.spec.Grid`) and the configs that
    target it. ``size`` names the table whose values are crossed with the placements of N (one joint
    factor), so every size meets every placement (below, at, a multiple of, past a multiple) and,
    pairwise, every value of every other setting."""

    configs: tuple[str, ...]
    tables: Mapping[str, tuple]                      # config key -> interesting values (the default first)
    unit: Callable[[Mapping[str, Any]], int]         # the size N is placed below, at, around
    size: str | None
    extra: Mapping[str, tuple]                       # non-config settings (layers, calls, path)
    spans: tuple[int, int]                           # "multiple": spans[0] * unit, "ragged": spans[1] * unit + 1
    allowed: Callable[[Mapping[str, Any]], bool]
    shape: tuple[str, ...]                           # which shape factors apply
    owner: str                                       # "attention/x.py: Class" (what error lines name)


def _families() -> dict[str, Family]:
    """The families of every config whose spec is complete (tests/attention/test_specs.py fails the others)."""
    members: dict[str, list[str]] = defaultdict(list)
    for config in complete_configs():
        members[family_of(config)].append(config)
    out = {}
    for family, configs in members.items():
        g, cls = spec_of(configs[0]).grid, class_of(configs[0])
        out[family] = Family(tuple(configs), g.tables, g.unit, g.size, g.extra, g.spans, g.allowed,
                             g.shape or tuple(SHAPE), f"{where(cls)}: {cls.__name__}")
    return out


FAMILIES: dict[str, Family] = _families()
RANGES: dict[str, Mapping[str, Range]] = {f: spec_of(fam.configs[0]).ranges for f, fam in FAMILIES.items()}


@dataclass(frozen=True)
class Point:
    """One grid point: the config, its overrides and the shapes it runs at."""

    config: str
    overrides: dict[str, Any]
    heads: int
    n: int
    max_len: int
    lengths: tuple[int, ...]
    train: bool
    extra: dict[str, Any]

    def describe(self) -> str:
        over = ",".join(f"{k}={_short(v)}" for k, v in self.overrides.items())
        more = ",".join(f"{k}={v}" for k, v in self.extra.items())
        return (f"{self.config}[{over}] heads={self.heads} n={self.n} max_len={self.max_len} "
                f"lengths={list(self.lengths)} {'train' if self.train else 'eval'} {more}").strip()


def _short(v: Any) -> str:
    if isinstance(v, dict):                            # a nested _target_ (abc's W_phi tie)
        return v.get("_target_", "").rpartition(".")[2] or str(v)
    if isinstance(v, tuple):
        return "/".join(f"{x:g}" for x in v)
    return str(v)


def place(kind: str, unit: int, spans: tuple[int, int]) -> int:
    """N below, at, a multiple of, or just past a multiple of ``unit``."""
    return {"below": max(1, unit - 1), "at": unit, "multiple": spans[0] * unit, "ragged": spans[1] * unit + 1}[kind]


def row_lengths(kind: str, n: int) -> tuple[int, ...]:
    """Real lengths of the rows: all N; N, two thirds, 2 and 0 (a row shorter than any cluster or
    window, a fully padded one); or every row shorter than N (the batch padded past its longest)."""
    if kind == "full":
        return (n, n, n)
    if kind == "ragged":
        return (n, max(1, 2 * n // 3), min(2, n), 0)
    return (max(1, n - 1), 1, 0)


def factors(config: str) -> dict[str, tuple]:
    """The grid's factors for ``config``: its YAML keys (fixed where it differs from its family's
    first config), the family's extra settings and the shape settings."""
    fam = FAMILIES[family_of(config)]
    out: dict[str, tuple] = {}
    for key, value in config_values(config).items():
        if key not in fam.tables:
            raise KeyError(f"conf/attention/{config}.yaml exposes {key!r}, which {fam.owner}.spec.grid has no table for")
        out[key] = fam.tables[key] if fam.tables[key][0] == value else (value,)
    out.update(fam.extra)
    out.update({k: SHAPE[k] for k in fam.shape})
    return out


def joined(config: str) -> tuple[dict[str, tuple], Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """The factors with the family's size table and "n" joined into one factor (when the config
    varies the size), and the function that splits a row back."""
    fam, fs = FAMILIES[family_of(config)], factors(config)
    key = fam.size
    if key is None or key not in fs or "n" not in fs:
        return fs, dict
    both = f"{key}+n"
    out = {both: tuple((v, kind) for v in fs[key] for kind in fs["n"])}
    out.update({k: v for k, v in fs.items() if k not in (key, "n")})

    def split(row: Mapping[str, Any]) -> dict[str, Any]:
        plain = {k: v for k, v in row.items() if k != both}
        if both in row:
            plain[key], plain["n"] = row[both]
        return plain
    return out, split


@cache
def grid(config: str) -> tuple[Point, ...]:
    fam = FAMILIES[family_of(config)]
    keys = set(config_values(config))
    points = []
    fs, split = joined(config)
    for row in map(split, all_pairs(fs, lambda r: fam.allowed(split(r)))):
        over = {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items() if k in keys}
        n = place(row["n"], fam.unit(row), fam.spans)
        max_len = n if row.get("max_len", "n") == "n" else 2 * n + 3
        extra = {k: row[k] for k in fam.extra}
        points.append(Point(config, over, row["heads"], n, max_len, row_lengths(row["rows"], n),
                            row["mode"] == "train", extra))
    return tuple(points)


def every_config() -> list[str]:
    return variant_names()


def grid_size() -> int:
    return sum(len(grid(c)) for c in every_config())
