"""Stage 2 of the checks: the composed config, with OmegaConf only (no torch), every problem at once.

Types and ranges of every setting the suite reads (``seed=abc``, ``optim.lr=-1``,
``model.dropout=1.5``, ``threads=0``), named as the user wrote them (``task.val_every=0``, not the
``trainer.val_check_interval`` it feeds); settings that would make a run meaningless
(``trainer.max_steps=0`` tests an untrained model, ``checkpointing.every_n_steps=0`` silently
disables resume, ``trainer.gradient_clip_val=-1`` clips nothing); a ``ckpt_path`` that is a folder or
missing; unwritable folders; warnings for ``trainer.fast_dev_run`` (a dry run) and a warm-up longer
than the run. The rules of every mode are here (bench's too); the report's own settings, which need
the run records, are checked by the report (:mod:`lra.report.arguments`), the attention variants'
by the variants (stage 3, :mod:`lra.checks.build`).
"""
from __future__ import annotations

import difflib
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lra import CONF_DIR
from lra.badinput import ConfigError, DataMissingError
from lra.files import ensure_writable

log = logging.getLogger(__name__)
# fetch downloads data and starts no run: run.py hands ``mode=fetch`` to lra.data.fetch before Hydra
MODES = ("train", "test", "bench", "report", "check", "fetch")
RESUME_MODES = ("auto", True, False)
PRETRAIN_OBJECTIVES = ("mlm", "causal")  # models.pretraining.OBJECTIVES (torch-free here; a test pins them equal)


class PropertiesFailed(Exception):
    """``mode=check``: the variant fails properties of the attention contract (lra/checks/variant.py).
    Not a user error of the settings: ``run.py`` exits 1 (in a sweep, that job fails). Here, beside
    the modes, so ``run.py`` names it without importing torch."""


# ----------------------------------------------------------------------------- value rules
@dataclass(frozen=True)
class Rule:
    """``key`` must be an ``int`` (or any number) within ``[low, high]`` (open ends optional)."""

    key: str
    kind: str                       # "int" | "number"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    example: str = ""
    why: str = ""                   # what an out-of-range value would do
    modes: tuple[str, ...] = ("train", "test")

    def describe(self) -> str:
        what = "a whole number" if self.kind == "int" else "a number"
        if self.low is not None and self.high is not None:
            what += f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            what += f" {'>' if self.low_open else '>='} {_num(self.low)}"
        return what + (" or null" if self.nullable else "")

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None if self.nullable else "must be set"
        is_int = isinstance(value, int) and not isinstance(value, bool)
        is_num = is_int or (isinstance(value, float) and math.isfinite(value))
        if not (is_int if self.kind == "int" else is_num):
            return f"must be {self.describe()}"
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return f"must be {self.describe()}"
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return f"must be {self.describe()}"
        return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


UNIT = dict(low=0.0, high=1.0, high_open=True)
RULES: tuple[Rule, ...] = (
    Rule("seed", "int", 0, example="seed=0", modes=("train", "test", "bench")),
    Rule("threads", "int", 1, nullable=True, example="threads=1", why="null = torch's default of one per core",
         modes=("train", "test", "bench")),
    Rule("optim.lr", "number", 0, low_open=True, example="optim.lr=1e-4"),
    Rule("optim.weight_decay", "number", 0, example="optim.weight_decay=0.0"),
    Rule("optim.warmup_steps", "int", 0, example="optim.warmup_steps=1000"),
    Rule("trainer.max_steps", "int", 1, example="trainer.max_steps=5000",
         why="0 trains nothing and reports the test accuracy of an untrained model; -1 (Lightning's "
             "'no limit') leaves the learning-rate schedule without an end"),
    Rule("trainer.val_check_interval", "number", 0, low_open=True, nullable=True, example="trainer.val_check_interval=50"),
    Rule("trainer.gradient_clip_val", "number", 0, low_open=True, nullable=True, example="trainer.gradient_clip_val=1.0",
         why="Lightning skips clipping at 0 or below, so the value would do nothing; write null for no clipping"),
    Rule("trainer.accumulate_grad_batches", "int", 1, example="trainer.accumulate_grad_batches=2",
         why="1 = no accumulation"),
    Rule("trainer.compile_limit", "int", 1, example="trainer.compile_limit=32",
         why="each batch shape or mode compiles one graph; the run stops when this many would not do"),
    Rule("task.max_len", "int", 1, example="task.max_len=1000"),
    Rule("task.batch_size", "int", 1, example="task.batch_size=32"),
    Rule("model.d_model", "int", 1, example="model.d_model=64"),
    Rule("model.n_layers", "int", 1, example="model.n_layers=2"),
    Rule("model.n_heads", "int", 1, example="model.n_heads=2"),
    Rule("model.d_ffn", "int", 1, example="model.d_ffn=128"),
    Rule("model.d_head", "int", 1, example="model.d_head=128"),
    Rule("model.dropout", "number", **UNIT, example="model.dropout=0.1"),
    Rule("attention.dropout", "number", **UNIT, example="attention.dropout=0.0"),
    Rule("checkpointing.every_n_steps", "int", 1, nullable=True, example="checkpointing.every_n_steps=100",
         why="0 silently turns periodic checkpoints off, so a killed run cannot resume; write null to "
             "turn them off on purpose", modes=("train",)),
    Rule("checkpointing.every_minutes", "number", 0, low_open=True, nullable=True,
         example="checkpointing.every_minutes=30", modes=("train",)),
    # self-pretraining (+pretrain=mlm|causal, conf/pretrain/; lra/training/pretrain.py)
    Rule("pretrain.mask_ratio", "number", 0, 1, low_open=True, high_open=True, example="pretrain.mask_ratio=0.5",
         why="the share of real tokens masked: 0 masks none, 1 leaves nothing to predict from", modes=("train",)),
    Rule("pretrain.max_steps", "int", 1, example="pretrain.max_steps=5000", why="the pretraining budget in steps",
         modes=("train",)),
    Rule("pretrain.warmup_steps", "int", 0, example="pretrain.warmup_steps=1000", modes=("train",)),
    Rule("pretrain.lr", "number", 0, low_open=True, example="pretrain.lr=1e-4", modes=("train",)),
    Rule("pretrain.val_every", "int", 1, nullable=True, example="pretrain.val_every=500",
         why="null = ten validations over the budget", modes=("train",)),
    # bench.repeats, warmup, rounds, min_time_s, lengths, protocol...: lra.bench.harness.check_settings,
    # which python -m lra.bench runs too
    Rule("bench.threads", "int", 1, nullable=True, example="bench.threads=1", modes=("bench",)),
    Rule("bench.timeout_s", "number", 0, low_open=True, nullable=True, example="bench.timeout_s=1800", modes=("bench",)),
)
INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")
ABSENT = object()


def _select(cfg: DictConfig, key: str) -> Any:
    """The resolved value at ``key`` (``ABSENT`` if there is none); a broken interpolation is a user error."""
    try:
        value = OmegaConf.select(cfg, key, default=ABSENT, throw_on_missing=True)
    except Exception as e:  # noqa: BLE001 - any resolution failure is a setting the user wrote
        raise ConfigError(f"setting {key} cannot be resolved ({type(e).__name__}: {str(e).splitlines()[0]}); "
                          f"check the value given for it or for what it refers to") from None
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def origin(cfg: DictConfig, key: str) -> str:
    """The setting a value comes from: ``trainer.val_check_interval`` is ``${task.val_every}``, and a
    user who wrote ``task.val_every=0`` must read that name back (plain interpolations are followed)."""
    seen = {key}
    while True:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        try:
            raw = node._get_node(leaf)._value() if isinstance(node, DictConfig) else None
        except Exception:  # noqa: BLE001 - no such node: the key itself is the answer
            return key
        match = INTERPOLATION.match(raw) if isinstance(raw, str) else None
        if match is None or match.group(1) in seen:
            return key
        key = match.group(1)
        seen.add(key)


def _show(key: str, value: Any) -> str:
    return f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"


def _unknown_choice(key: str, value: object, valid: list[str] | tuple[str, ...], label: str = "valid") -> str:
    """``unknown key='value'; valid: a, b (did you mean key=a?)``."""
    close = difflib.get_close_matches(str(value), list(valid), n=1)
    return (f"unknown {key}={value!r}; {label}: {', '.join(valid)}"
            + (f" (did you mean {key}={close[0]}?)" if close else ""))


def ablation_owner(ablation: str, conf_dir: Path = CONF_DIR) -> str | None:
    """The attention variant an ablation config belongs to: the one its defaults select
    (``- override /attention: <name>``); None if it selects none."""
    path = conf_dir / "ablation" / f"{ablation}.yaml"
    if not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, DictConfig) and "override /attention" in entry:
            return str(entry["override /attention"])
    return None


def _ablation_problem() -> str | None:
    """An ablation sets settings of one variant; another ``attention=`` on the command line would
    receive them (and fail later with an unknown-setting error that names the wrong fix)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    choices = HydraConfig.get().runtime.choices
    ablation, attention = choices.get("ablation"), choices.get("attention")
    owner = ablation_owner(str(ablation)) if ablation else None
    if owner is None or attention == owner:
        return None
    return (f"ablation={ablation} is an ablation of attention={owner} and sets its settings, but attention={attention} "
            f"is selected; drop attention={attention} (the ablation selects attention={owner} itself)")


def check_config(cfg: DictConfig) -> list[str]:
    """Every problem of the composed config at once, as one :class:`ConfigError`.

    Returns the warnings (settings that are legal but probably not meant); they are also logged.
    """
    problems: list[str] = []
    _check_resolution(cfg)
    mode = _select(cfg, "mode")
    if mode not in MODES:
        problems.append(_unknown_choice("mode", mode, MODES, "valid modes"))
        mode = "train"
    elif mode == "fetch":  # quoted, swept or set by a preset: it reached Hydra, which runs only runs
        problems.append("mode=fetch starts no run, so it cannot be swept, quoted or set in a preset; write it "
                        "as a plain argument of its own, e.g. python run.py mode=fetch task=text")
    reported: set[str] = set()
    for rule in RULES:
        if mode not in rule.modes:
            continue
        value = _select(cfg, rule.key)
        if value is ABSENT:
            continue
        issue = rule.problem(value)
        named = origin(cfg, rule.key)  # task.val_every=0 reaches trainer.val_check_interval: name task.val_every
        if issue and named not in reported:
            reported.add(named)
            example = rule.example.replace(rule.key + "=", named + "=") if rule.example else ""
            problems.append(f"{_show(named, value)} is invalid: it {issue}"
                            + (f" (it sets {rule.key})" if named != rule.key else "")
                            + (f" ({rule.why})" if rule.why else "") + (f", e.g. {example}" if example else ""))
    betas = _select(cfg, "optim.betas")
    if betas is not ABSENT and mode in ("train", "test"):
        ok = (isinstance(betas, list) and len(betas) == 2
              and all(Rule("b", "number", **UNIT).problem(b) is None for b in betas))
        if not ok:
            problems.append(f"optim.betas={betas} is invalid: it must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.999]")
    schedule = _select(cfg, "optim.schedule")
    if schedule is not ABSENT and mode in ("train", "test"):
        from models.schedule import SCHEDULES  # math only

        if schedule not in SCHEDULES:
            problems.append(_unknown_choice("optim.schedule", schedule, list(SCHEDULES)))
    objective = _select(cfg, "pretrain.objective")
    if objective is not ABSENT and mode == "train":
        if objective not in PRETRAIN_OBJECTIVES:
            problems.append(_unknown_choice("pretrain.objective", objective, PRETRAIN_OBJECTIVES)
                            + " (or choose the preset: +pretrain=mlm or +pretrain=causal)")
    resume = _select(cfg, "resume")
    if resume is not ABSENT and resume not in RESUME_MODES:
        problems.append(f"resume={resume!r} is not valid; use resume=auto (default), resume=true or resume=false")
    ablation = _ablation_problem()
    if ablation:
        problems.append(ablation)
    if mode == "check":
        problems += _check_mode_problems(cfg)
    ckpt = _select(cfg, "ckpt_path")
    if mode == "test" and not ckpt:
        problems.append("mode=test evaluates a trained checkpoint but no ckpt_path is given; pass "
                        "ckpt_path=<checkpoint_dir>/<run id>/best-<step>.ckpt")
    if problems:
        raise ConfigError("; ".join(problems) + ".")
    if ckpt and mode in ("train", "test") and Path(str(ckpt)).expanduser().is_dir():
        inside = sorted(p.name for p in Path(str(ckpt)).expanduser().glob("*.ckpt"))
        raise ConfigError(f"ckpt_path={ckpt} is a folder; pass one checkpoint file in it"
                          + (f" ({', '.join(inside[:5])}), e.g. ckpt_path={Path(str(ckpt)) / inside[-1]}" if inside
                             else " (it holds no .ckpt file)"))
    if ckpt and mode in ("train", "test") and not Path(str(ckpt)).expanduser().is_file():
        raise DataMissingError(f"ckpt_path={ckpt} does not exist; pass an existing .ckpt file "
                               f"(checkpoints are under paths.checkpoint_dir/<run id>/)")
    if mode in ("train", "test", "bench"):
        _check_folders(cfg, mode)
    return _warnings(cfg, mode)


def _check_mode_problems(cfg: DictConfig) -> list[str]:
    """``mode=check``'s own settings (lra/checks/variant.py)."""
    found = []
    compile_ = _select(cfg, "check.compile")
    if compile_ is not ABSENT and not isinstance(compile_, bool):
        found.append(f"{_show('check.compile', compile_)} is invalid: it must be true or false, e.g. check.compile=false")
    device = _select(cfg, "check.device")
    if device is not ABSENT and device not in ("cpu", "cuda"):
        found.append(_unknown_choice("check.device", device, ("cpu", "cuda")))
    return found


def _check_resolution(cfg: DictConfig) -> None:
    """Pathfinder's max_len is looked up from task.resolution: an unknown one would only show as a
    broken interpolation of task.max_len."""
    seq_lens, resolution = _select(cfg, "task.seq_lens"), _select(cfg, "task.resolution")
    if isinstance(seq_lens, dict) and resolution is not ABSENT and f"{resolution}px" not in seq_lens:
        valid = ", ".join(k.removesuffix("px") for k in seq_lens)
        raise ConfigError(f"task.resolution={resolution} is not supported; valid: {valid} (e.g. task.resolution=32)")


def _check_folders(cfg: DictConfig, mode: str) -> None:
    """The folders a run writes. data_dir is checked first thing in prepare_data (after the run's
    record exists, which then says "failed"); the report checks its own (lra.report.arguments)."""
    keys = {"train": ("results_dir", "checkpoint_dir"), "test": ("results_dir", "checkpoint_dir"),
            "bench": ("results_dir",)}[mode]
    for key in keys:
        value = _select(cfg, f"paths.{key}")
        if value not in (ABSENT, None):
            ensure_writable(Path(str(value)), key.replace("_dir", " dir"))


def _warnings(cfg: DictConfig, mode: str) -> list[str]:
    found: list[str] = []
    if mode in ("train", "test"):
        if _select(cfg, "trainer.fast_dev_run") not in (ABSENT, None, False, 0):
            found.append("trainer.fast_dev_run is on: a dry run of one batch per split, no checkpoints; its record "
                         "says mode=dry_run and stays out of the report and of resume/skip")
    if mode == "train":
        warmup, steps = _select(cfg, "optim.warmup_steps"), _select(cfg, "trainer.max_steps")
        if isinstance(warmup, int) and isinstance(steps, int) and warmup >= steps:
            found.append(f"optim.warmup_steps={warmup} >= trainer.max_steps={steps}: the learning rate never "
                         f"leaves its warm-up (lower optim.warmup_steps for a short run)")
        every, minutes = _select(cfg, "checkpointing.every_n_steps"), _select(cfg, "checkpointing.every_minutes")
        if every is None and minutes in (None, ABSENT):
            found.append("checkpointing.every_n_steps=null and checkpointing.every_minutes=null: no last.ckpt is "
                         "written, so a killed run starts again from step 0")
    for message in found:
        log.warning(message)
    return found
