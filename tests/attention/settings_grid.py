"""The settings grid of the reference tests: for every attention config, a small table of
interesting values for every hyperparameter its YAML exposes and for every setting that changes a
code path (heads, the sequence length against ``max_len`` and against the block, chunk, window or
segment it is cut into, padded rows, train or eval, layers, repeated training calls), crossed
pairwise (:func:`tests.attention.allpairs.all_pairs`), not as the full product.

Tables hold values at, below and above the sizes they interact with (kernels wider than their
block, one bucket, one cluster, clusters and windows larger than the sequence), the ends of the
valid ranges (decay 0 and 1, iterations 0, no random blocks) and decays and temperatures away
from symmetric values such as 0.5. A config that differs from its family's first config in some
keys keeps those at its own values (they are what makes it that config) and varies the rest.

``RANGES`` writes down the valid range of every numeric hyperparameter as the constructors (and, for
``dropout``, lra/checks/config.py) check it; tests/attention/test_settings_fuzz.py tests that
they accept the ends and refuse the values just outside, that every table value lies inside, and
draws the hypothesis fuzz over configs from these ranges.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Mapping

from omegaconf import OmegaConf

from attention.registry import CONF_DIR, variant_names
from tests.attention.allpairs import all_pairs

HEAD_DIM = 4
TIMES: dict[str, list[float]] = defaultdict(list)     # seconds per grid point run, by config
HYDRA = {"_target_", "_partial_"}
TIE = {"_target_": "attention.abc.ControlTie"}          # abc's W_phi tied across layers
SHAPE = {
    "heads": (1, 2, 4),
    "n": ("below", "at", "multiple", "ragged"),       # N against the family's unit (block, chunk, ...)
    "max_len": ("n", "above"),                         # max_len = N, or above and no multiple of it
    "rows": ("full", "ragged", "short"),               # real lengths of the batch's rows
    "mode": ("train", "eval"),
}


def no(**bad: Any) -> Callable[[Mapping[str, Any]], bool]:
    """A constraint: the row may not hold all of ``bad`` at once (partial rows pass)."""
    return lambda row: not all(k in row and row[k] == v for k, v in bad.items())


@dataclass(frozen=True)
class Family:
    """One attention module: its configs, value tables and where the sequence length sits.

    ``size`` names the table whose values are crossed with the placements of N (one joint factor),
    so every size meets every placement (below, at, a multiple of, past a multiple) and, pairwise,
    every value of every other setting."""

    configs: tuple[str, ...]
    tables: dict[str, tuple]                         # config key -> interesting values
    unit: Callable[[Mapping[str, Any]], int]         # the size N is placed below, at, around
    size: str | None = None                          # the table crossed with "n"
    extra: dict[str, tuple] = field(default_factory=dict)   # non-config settings (layers, calls, path)
    spans: tuple[int, int] = (3, 2)                  # "multiple": spans[0] * unit, "ragged": spans[1] * unit + 1
    allowed: Callable[[Mapping[str, Any]], bool] = lambda row: True
    shape: tuple[str, ...] = tuple(SHAPE)            # which shape factors apply


def cap(size: int | None, default: int = 4, most: int = 16) -> int:
    """A size as a placement unit for N: sizes above ``most`` act as 'larger than the sequence'."""
    return min(size if size else default, most)


def _nystrom_allowed(row: Mapping[str, Any]) -> bool:
    """A kernel wider than the banded conv's 16-position block needs a sequence longer than 16."""
    if (row.get("conv_kernel") or 0) > 33:
        return row.get("n", "multiple") in ("multiple", "ragged") and row.get("num_landmarks", 8) >= 8
    return True


def _routing_allowed(row: Mapping[str, Any]) -> bool:
    """No more local heads than heads; decay and commitment act in training only (eval updates
    nothing), so their other values are spent on training points."""
    if row.get("local_heads") is not None and "heads" in row and row["local_heads"] > row["heads"]:
        return False
    return row.get("mode") != "eval" or (row.get("decay", 0.999) == 0.999 and row.get("commitment", 1e-4) == 1e-4)


FAMILIES: dict[str, Family] = {
    "softmax": Family(("softmax",), {"dropout": (0.0, 0.1)}, lambda r: 4,
                      allowed=no(dropout=0.1, mode="train")),          # dropout draws: compared in eval
    "linear": Family(("linear",), {"eps": (1e-6, 1e-2, 1.0)}, lambda r: 4),
    "performer": Family(
        ("performer", "performer_32"),
        {"nb_features": (256, 32, 1, 3, 4, 5, 9), "kernel": ("softmax", "relu"), "redraw_interval": (1000, 0, 1, 3),
         "orthogonal": (True, False), "eps": (None, 0.0, 1e-3)},
        lambda r: 4, extra={"calls": (1, 2, 4)}),                      # training calls before the compared one
    "linformer": Family(("linformer",), {"k": (256, 1, 3, 8), "share_kv": (False, True)},
                        size="k", unit=lambda r: cap(r["k"])),
    "nystromformer": Family(
        ("nystromformer", "nystromformer_64"),
        {"num_landmarks": (32, 64, 1, 3, 8), "pinv_iterations": (6, 1, 2), "conv_kernel": (33, None, 1, 3, 35, 65)},
        size="num_landmarks", unit=lambda r: cap(r["num_landmarks"]), allowed=_nystrom_allowed),
    "reformer": Family(
        ("reformer",),
        {"n_hashes": (2, 1, 3), "bucket_size": (32, 2, 5, 8, 64), "chunk_size": (64, 1, 3, 7),
         "self_penalty": (1e5, 1.0)},
        size="chunk_size", unit=lambda r: cap(r["chunk_size"])),
    "bigbird": Family(
        ("bigbird",),
        {"block_size": (64, 1, 2, 3, 5), "num_random_blocks": (3, 0, 1, 2, 5), "window_blocks": (3, 1, 5)},
        # 7 blocks: the middle blocks have random candidates beyond their window
        size="block_size", unit=lambda r: cap(r["block_size"], most=8), spans=(7, 6)),
    "local": Family(("local",), {"block_size": (64, 1, 3, 5), "window": (1, 0, 2, 5)},
                    size="block_size", unit=lambda r: cap(r["block_size"])),
    "longformer": Family(("longformer",), {"window": (128, 0, 1, 2, 5, 8)},
                         size="window", unit=lambda r: cap(max(1, r["window"] // 2))),
    "sparse": Family(
        ("sparse", "sparse_strided"),
        {"pattern": ("fixed", "strided"), "stride": (None, 1, 2, 5), "summary": (8, 1, 2)},
        size="stride", unit=lambda r: cap(r["stride"])),
    "sinkhorn": Family(
        ("sinkhorn",),
        {"block_size": (32, 1, 3, 4), "sinkhorn_iterations": (7, 1, 3), "temperature": (0.75, 0.3, 2.0),
         "gumbel_noise": (True, False)},
        size="block_size", unit=lambda r: cap(r["block_size"], most=8)),
    "synthesizer_dense": Family(("synthesizer_dense",), {"hidden": (None, 1, 3, 9)}, lambda r: 4),
    "synthesizer_random": Family(("synthesizer_random",), {"trainable": (True, False), "rank": (None, 1, 3)},
                                 lambda r: 4),
    "abc": Family(
        ("abc_mlp", "abc_rd"),
        {"memory_size": (64, 1, 3, 8), "control": ("mlp", "random", "linformer", "segment"),
         "normalize": (True, False), "tie": (TIE, None)},
        size="memory_size", unit=lambda r: cap(r["memory_size"]),
        extra={"layers": (1, 2)}),                                     # tie: W_phi shared by the layers
    "adamra": Family(
        ("adamra", "adamra_elu", "adamra_random_router", "adamra_softmax", "adamra_t2a", "adamra_t2b"),
        {"rates": ((0.5, 0.125, 0.03125), (1.0,), (0.6, 0.35), (0.25, 1.0, 0.5), (0.1,)),
         "feature_map": ("relu", "elu", "softmax"), "router": ("learned", "random"), "head_proj": (True, False),
         "eps": (1e-6, 0.5)},
        size="rates", unit=lambda r: cap(max(max(1, round(1 / c)) for c in r["rates"]), most=8),
        extra={"path": ("mixer", "shell")}),                           # forward on q, k, v or the fused shell path
    "clustered": Family(
        ("clustered", "i_clustered"),
        {"clusters": (100, 1, 3, 5), "bits": (63, 1, 4), "iterations": (10, 0, 1, 4), "improved": (False, True),
         "topk": (32, 1, 3)},
        size="clusters", unit=lambda r: cap(r["clusters"], most=8), spans=(6, 5)),   # queries per cluster
    "routing": Family(
        ("routing",),
        {"n_clusters": (None, 1, 3, 7, 16), "local_heads": (None, 0, 1, 2), "window": (256, 1, 3, 8),
         "decay": (0.999, 0.0, 0.3, 1.0), "commitment": (1e-4, 0.0, 0.3)},
        size="window", unit=lambda r: cap(r["window"], most=8), allowed=_routing_allowed),
    "memformer": Family(
        ("memformer",),
        {"memory_slots": (32, 1, 3), "segment_len": (32, 1, 4, 5), "memory": ("unified", "per_layer"),
         "mrbp": (False, True)},
        size="segment_len", unit=lambda r: cap(r["segment_len"], most=6),
        extra={"layers": (1, 2, 3), "pool": ("mean", "cls")},
        shape=("heads", "n", "rows", "mode")),
}


@dataclass(frozen=True)
class Range:
    """A hyperparameter's valid range as the constructor (for ``dropout``: lra/checks/config.py)
    checks it; ``draw`` is the part the config fuzz draws from (small, for time)."""

    kind: str                                  # "int", "odd" (odd int), "float", "rates" (list of floats)
    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False                     # null is valid (a documented default)
    draw: tuple[float, float] = (0, 8)
    rejects: tuple[Any, ...] | None = None     # values just outside (default: derived from the bounds)

    def outside(self) -> tuple[Any, ...]:
        if self.rejects is not None:
            return self.rejects
        step = 1 if self.kind in ("int", "odd") else 1e-3
        out = [self.low if self.low_open else self.low - step]
        if self.high is not None:
            out.append(self.high if self.high_open else self.high + step)
        if self.kind == "odd":
            out.append(self.low + 1)
        return tuple(out)

    def inside(self) -> tuple[Any, ...]:
        ends = [self.draw[0] if self.low_open else self.low]
        if self.high is not None and not self.high_open:
            ends.append(self.high)
        return tuple(ends) + ((None,) if self.nullable else ())


def _int(low: int, most: int, **kw: Any) -> Range:
    return Range("int", low, draw=(low, most), **kw)


RANGES: dict[str, dict[str, Range]] = {
    "softmax": {"dropout": Range("float", 0.0, 1.0, high_open=True, draw=(0.0, 0.5))},
    "linear": {"eps": Range("float", 0.0, low_open=True, draw=(1e-9, 1.0))},
    "performer": {"nb_features": _int(1, 12), "redraw_interval": _int(0, 4),
                  "eps": Range("float", 0.0, nullable=True, draw=(0.0, 1e-2))},
    "linformer": {"k": _int(1, 20)},
    "nystromformer": {"num_landmarks": _int(1, 12), "pinv_iterations": _int(1, 8),
                      "conv_kernel": Range("odd", 1, nullable=True, draw=(1, 41), rejects=(2, -1))},
    "reformer": {"n_hashes": _int(1, 4), "bucket_size": _int(1, 16), "chunk_size": _int(1, 12)},
    "bigbird": {"block_size": _int(1, 6), "num_random_blocks": _int(0, 5),
                "window_blocks": Range("odd", 1, draw=(1, 7))},
    "local": {"block_size": _int(1, 8), "window": _int(0, 4)},
    "longformer": {"window": _int(0, 16)},
    "sparse": {"stride": _int(1, 8, nullable=True), "summary": _int(1, 8)},
    "sinkhorn": {"block_size": _int(1, 8), "sinkhorn_iterations": _int(1, 8),
                 "temperature": Range("float", 0.0, low_open=True, draw=(0.05, 3.0))},
    "synthesizer_dense": {"hidden": _int(1, 10, nullable=True)},
    "synthesizer_random": {"rank": _int(1, 6, nullable=True)},
    "abc": {"memory_size": _int(1, 12)},
    "adamra": {"rates": Range("rates", 0.0, 1.0, low_open=True, draw=(0.02, 1.0), rejects=([0.0], [1.5], [])),
               "eps": Range("float", 0.0, low_open=True, draw=(1e-9, 1.0))},
    "clustered": {"clusters": _int(1, 8), "bits": _int(1, 16), "iterations": _int(0, 6), "topk": _int(1, 8)},
    "routing": {"n_clusters": _int(1, 8, nullable=True), "local_heads": _int(0, 4, nullable=True),
                "window": _int(1, 8), "decay": Range("float", 0.0, 1.0, draw=(0.0, 1.0)),
                "commitment": Range("float", 0.0, draw=(0.0, 1.0))},
    "memformer": {"memory_slots": _int(1, 4), "segment_len": _int(1, 6)},
}


def family_of(config: str) -> str:
    found = [f for f, fam in FAMILIES.items() if config in fam.configs]
    if len(found) != 1:
        raise KeyError(f"config {config!r} belongs to {len(found)} families of the settings grid")
    return found[0]


@cache
def config_values(config: str) -> dict[str, Any]:
    """The hyperparameters ``conf/attention/<config>.yaml`` exposes, with their values."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{config}.yaml"))
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k not in HYDRA}


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
    if v == TIE:
        return "tie"
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
    own, base = config_values(config), config_values(fam.configs[0])
    out: dict[str, tuple] = {}
    for key, value in own.items():
        if key not in fam.tables:
            raise KeyError(f"{config}.yaml exposes {key!r}, which the settings grid has no table for")
        out[key] = fam.tables[key] if key in base and base[key] == value else (value,)
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
