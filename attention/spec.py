"""What the suite knows about an attention class, written once, next to the class: ``spec = Spec(...)``.

The settings grid of the reference tests (tests/attention/settings_grid.py), the approximation map
(lra/bench/approximation.py), the peers race (lra/bench/peers.py), the contract tests and their
known failures read a config's spec through :func:`spec_of`; none keeps a table of its own. A config
(``conf/attention/<name>.yaml``) gets the spec of the class its ``_target_`` names, with the entries
of ``configs[name]`` put over the class's (performer_32's knob values, i_clustered's sizes), so a new
YAML that targets an existing class needs no other edit. Required fields are :data:`REQUIRED`; a
spec that lacks one fails with one line naming the field and the file (:class:`SpecError`).
Plain data and functions only: the attention layer imports neither ``lra`` nor ``tests``.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping

from attention.registry import CONF_DIR, variant_names

ROOT = CONF_DIR.parent


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
Row = Mapping[str, Any]


@dataclass(frozen=True)
class Knob:
    """One budget axis of the approximation map: the config key, the values swept (the default is
    always added), how a value becomes config overrides (``None``: ``{key: value}``) and the
    default's value when it is no config value (a scale factor's 1.0)."""
    key: str
    values: tuple
    to_overrides: Callable[[Any, dict], dict] | None = None
    default: Any = MISSING

    def overrides(self, value: Any, default_cfg: dict) -> dict:
        return self.to_overrides(value, default_cfg) if self.to_overrides else {self.key: value}

    def default_value(self, cfg: Mapping[str, Any]) -> Any:
        return cfg.get(self.key) if self.default is MISSING else self.default


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


def int_range(low: int, most: int, **kw: Any) -> Range:
    """An integer range from ``low`` up, drawn up to ``most``."""
    return Range("int", low, draw=(low, most), **kw)


def no(**bad: Any) -> Callable[[Row], bool]:
    """A grid constraint: the row may not hold all of ``bad`` at once (partial rows pass)."""
    return lambda row: not all(k in row and row[k] == v for k, v in bad.items())


def cap(size: int | None, default: int = 4, most: int = 16) -> int:
    """A size as a placement unit for N: sizes above ``most`` act as 'larger than the sequence'."""
    return min(size if size else default, most)


@dataclass(frozen=True)
class Grid:
    """The class's settings grid (tests/attention/settings_grid.py): a table of interesting values for
    every key its YAMLs expose (the first value is the default: a config whose value differs keeps
    its own), the size N is placed below, at and around (``unit``), and which table is crossed with
    those placements (``size``). A config's keys left out of ``tables`` fail its grid."""

    tables: Mapping[str, tuple]
    unit: Callable[[Row], int] = lambda row: 4
    size: str | None = None                          # the table crossed with "n"
    extra: Mapping[str, tuple] = field(default_factory=dict)   # non-config settings (layers, calls, path)
    spans: tuple[int, int] = (3, 2)                  # "multiple": spans[0] * unit, "ragged": spans[1] * unit + 1
    allowed: Callable[[Row], bool] = lambda row: True
    shape: tuple[str, ...] | None = None             # which shape factors apply (None: all)


@dataclass(frozen=True)
class Peer:
    """One public implementation the race (lra/bench/peers.py) times against ``config``: ``build``
    and ``align`` name that module's adapter functions (``align`` None: outputs cannot be compared,
    ``why_not`` says why); ``biases``: whether the peer's (q/k/v, output) projections have biases."""
    config: str
    label: str
    package: str
    module: str
    mapping: str
    build: str
    align: str | None = None
    why_not: str = ""
    agree_overrides: Mapping[str, Any] = field(default_factory=dict)
    agree_tol: float | None = None                   # None: the race's default
    biases: tuple[bool, bool] = (True, True)


# pytorch-fast-transformers' (package, module): its __init__ loads every compiled extension
FT = ("pytorch-fast-transformers", "fast_transformers.attention")

# The fields every class must fill (what each is, as the error line says it).
REQUIRED = {
    "grid": "the settings grid's value tables, attention.spec.Grid, for every key the YAML exposes",
    "ranges": "the valid range of every numeric key, attention.spec.Range; {} for none",
    "knobs": "the approximation map's budget axes; () for none",
    "draws": "whether forward draws random numbers (self.rand/randn/randint): a bool or a function of the settings",
    "small": "settings under which the contract tests' 37 tokens span several blocks or clusters; {} for none",
}


@dataclass(frozen=True)
class Spec:
    """One class's entries. ``configs`` maps a config name to the fields it holds otherwise."""

    grid: Grid = MISSING
    ranges: Mapping[str, Range] = MISSING
    knobs: tuple[Knob, ...] = MISSING
    draws: bool | Callable[[Row], bool] = MISSING
    small: Mapping[str, Any] = MISSING
    fixed: Mapping[str, Any] = field(default_factory=dict)       # approximation overrides at every point
    excluded: str | None = None                                  # why the approximation map skips it
    peers: tuple[Peer, ...] = ()
    known_failures: Mapping[str, str] = field(default_factory=dict)   # contract check -> reason (strict xfail)
    documented: tuple[str, ...] | Callable[..., list] = ()       # derived settings the reference grid checks
    representative: str | None = None                            # the module's config for one-per-module tests
    train_noise_off: Mapping[str, Any] = field(default_factory=dict)  # contract: training noise off
    # the low-precision check's allowances (lra/checks/precision.py): "tol" (output, gradient) where
    # float32 itself amplifies rounding, "flips" the fraction of rows a rounded discrete decision may
    # flip, "cancelled" gradients zero in exact arithmetic (checked finite only), "small" sizes over ``small``
    precision: Mapping[str, Any] = field(default_factory=dict)
    family: str | None = None                                    # grid family name (default: the module's)
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def lacks(self) -> list[str]:
        return [f for f in REQUIRED if getattr(self, f) is MISSING]

    def of(self, config: str) -> Spec:
        return replace(self, **self.configs.get(config, {}))


class SpecError(ValueError):
    """A variant's spec is missing or incomplete; the message is one line naming the field and file."""


@cache
def config_values(config: str) -> dict[str, Any]:
    """The settings ``conf/attention/<config>.yaml`` exposes (lists as tuples), without Hydra's keys."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{config}.yaml"))
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k not in ("_target_", "_partial_")}


@cache
def class_of(config: str) -> type:
    """The class ``conf/attention/<config>.yaml``'s ``_target_`` names."""
    from omegaconf import OmegaConf

    if config not in variant_names():
        raise KeyError(f"unknown attention {config!r}; valid names: {', '.join(variant_names())}")
    target = str(OmegaConf.load(CONF_DIR / "attention" / f"{config}.yaml").get("_target_", ""))
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise SpecError(f"conf/attention/{config}.yaml: _target_ {target!r} does not import ({e})") from None


def where(cls: type) -> str:
    """The class's file, relative to the repository (what the error line tells the user to edit)."""
    try:
        path = Path(inspect.getsourcefile(cls) or "")
        return str(path.resolve().relative_to(ROOT))
    except (TypeError, ValueError):
        return cls.__module__.replace(".", "/") + ".py"


def problem(cls: type, config: str | None = None) -> str | None:
    """None when ``cls`` (for ``config``) has a complete spec, else one line naming what it lacks and the file."""
    spec = cls.__dict__.get("spec")
    if not isinstance(spec, Spec):
        return (f"{where(cls)}: {cls.__name__} has no spec (a class attribute `spec = Spec(...)` of "
                f"attention.spec after its docstring; docs/adding-a-variant.md)")
    spec = spec.of(config) if config else spec
    for name in spec.lacks():
        return f"{where(cls)}: {cls.__name__}.spec lacks {name!r} ({REQUIRED[name]})"
    unknown = sorted(set(spec.configs) - set(variant_names()))
    if unknown:
        return f"{where(cls)}: {cls.__name__}.spec.configs names {unknown[0]!r}, which is no conf/attention/*.yaml"
    return None


@cache
def spec_of(config: str) -> Spec:
    """The complete spec of ``config``; :class:`SpecError` (one line) when it lacks a field."""
    cls = class_of(config)
    line = problem(cls, config)
    if line:
        raise SpecError(line)
    return cls.__dict__["spec"].of(config)


def spec_problem(config: str) -> str | None:
    """None when ``config``'s spec is complete, else the one line :func:`spec_of` raises."""
    try:
        spec_of(config)
    except SpecError as e:
        return str(e)
    return None


def complete_configs() -> list[str]:
    """The configs whose spec is complete (the others fail tests/attention/test_specs.py)."""
    return [c for c in variant_names() if spec_problem(c) is None]


def family_of(config: str) -> str:
    """The settings grid's family of ``config``: its spec's ``family``, else its class's module name."""
    return spec_of(config).family or class_of(config).__module__.rpartition(".")[2]


def draws(config: str) -> bool:
    """Whether ``config``'s forward draws random numbers."""
    d = spec_of(config).draws
    return bool(d(config_values(config)) if callable(d) else d)


def small(config: str) -> dict[str, Any]:
    """The contract tests' sizes for ``config``: its spec's ``small``, for the keys its YAML exposes."""
    keys = config_values(config)
    return {k: v for k, v in spec_of(config).small.items() if k in keys}
