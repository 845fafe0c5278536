"""Check a run's whole configuration before any work, so a mistake costs seconds, not a data build.

Three stages, cheapest first, each raising :class:`lra.badinput.UserError` (one paragraph naming
the setting, the bad value and the fix):

1. :func:`check_overrides` - the command line, before Hydra composes it: an unknown group choice
   (``task=txt``) or a setting that does not exist (``trainer.max_step=5``) gets the closest valid
   name (difflib over the config's keys) instead of Hydra's advice to append ``+trainer.max_step``.
2. :func:`check_config` - the composed config, with OmegaConf only (no torch): types and ranges of
   every setting the suite reads (``seed=abc``, ``optim.lr=-1``, ``model.dropout=1.5``,
   ``threads=0``), named as the user wrote them (``task.val_every=0``, not the
   ``trainer.val_check_interval`` it feeds), settings that would make a run meaningless
   (``trainer.max_steps=0`` tests an untrained model, ``checkpointing.every_n_steps=0`` silently
   disables resume, ``trainer.gradient_clip_val=-1`` clips nothing, a longformer ``window`` below 2),
   warnings for legal settings that turn a variant into another (a reformer ``bucket_size`` or local
   ``block_size`` that spans the whole sequence) and for ``trainer.fast_dev_run`` (a dry run), a
   ``ckpt_path`` that is a folder, ``report.compare``'s two names, and unwritable folders.
3. :func:`check_build` - builds what the run will build, minus the data: the devices
   (:mod:`lra.training.devices`), the network and LightningModule (their constructors validate the
   attention and model settings), the DataModule (then ``check_sources()``: external data present?
   a batch no larger than the training set?), loads ``ckpt_path`` against the model, compares the
   keys of every ``_target_`` node that is built only later (trainer, callbacks, loggers) with its
   signature (``+trainer.max_step=5`` would otherwise fail as a raw ``TypeError`` after data
   preparation), and checks that an online ``logger=wandb`` can log (:mod:`lra.training.wandb_check`).
"""
from __future__ import annotations

import difflib
import inspect
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig, OmegaConf

from lra.badinput import ConfigError, DataMissingError, UserError
from lra.files import ensure_writable

log = logging.getLogger(__name__)
MODES = ("train", "test", "bench", "report")
RESUME_MODES = ("auto", True, False)
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


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
    Rule("bench.repeats", "int", 1, example="bench.repeats=5", modes=("bench",)),
    Rule("bench.warmup", "int", 0, example="bench.warmup=2", modes=("bench",)),
    Rule("bench.rounds", "int", 1, example="bench.rounds=1", modes=("bench",)),
    Rule("bench.min_time_s", "number", 0, example="bench.min_time_s=3.0", modes=("bench",)),
    Rule("bench.threads", "int", 1, nullable=True, example="bench.threads=1", modes=("bench",)),
    Rule("bench.timeout_s", "number", 0, low_open=True, nullable=True, example="bench.timeout_s=1800", modes=("bench",)),
)
# 0.6 made accumulate_grad_batches "close" to limit_val_batches (ratio 0.600); real typos score >= 0.8
SUGGEST_CUTOFF = 0.65
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


def _origin(cfg: DictConfig, key: str) -> str:
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


def check_config(cfg: DictConfig) -> list[str]:
    """Stage 2: every problem of the composed config at once, as one :class:`ConfigError`.

    Returns the warnings (settings that are legal but probably not meant); they are also logged.
    """
    problems: list[str] = []
    _check_resolution(cfg)
    mode = _select(cfg, "mode")
    if mode not in MODES:
        problems.append(_unknown_choice("mode", mode, MODES, "valid modes"))
        mode = "train"
    reported: set[str] = set()
    for rule in RULES:
        if mode not in rule.modes:
            continue
        value = _select(cfg, rule.key)
        if value is ABSENT:
            continue
        issue = rule.problem(value)
        origin = _origin(cfg, rule.key)  # task.val_every=0 reaches trainer.val_check_interval: name task.val_every
        if issue and origin not in reported:
            reported.add(origin)
            example = rule.example.replace(rule.key + "=", origin + "=") if rule.example else ""
            problems.append(f"{_show(origin, value)} is invalid: it {issue}"
                            + (f" (it sets {rule.key})" if origin != rule.key else "")
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
    if mode in ("train", "test"):
        problems += _attention_problems(cfg)
    resume = _select(cfg, "resume")
    if resume is not ABSENT and resume not in RESUME_MODES:
        problems.append(f"resume={resume!r} is not valid; use resume=auto (default), resume=true or resume=false")
    ckpt = _select(cfg, "ckpt_path")
    if mode == "test" and not ckpt:
        problems.append("mode=test evaluates a trained checkpoint but no ckpt_path is given; pass "
                        "ckpt_path=<checkpoint_dir>/<run id>/best-<step>.ckpt")
    compare = _select(cfg, "report.compare")
    if mode == "report" and compare not in (ABSENT, None):
        names = compare if isinstance(compare, list) else [compare]
        if len(names) != 2 or len({str(n) for n in names}) != 2 or not all(isinstance(n, str) and n for n in names):
            problems.append(f"report.compare={compare} must name two different variants to test against each other "
                            f"(every variant is already tested against softmax), e.g. report.compare=[adamra,linear]")
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
    if mode in ("train", "test", "bench", "report"):
        _check_folders(cfg, mode)
    return _warnings(cfg, mode)


def _check_resolution(cfg: DictConfig) -> None:
    """Pathfinder's max_len is looked up from task.resolution: an unknown one would only show as a
    broken interpolation of task.max_len."""
    seq_lens, resolution = _select(cfg, "task.seq_lens"), _select(cfg, "task.resolution")
    if isinstance(seq_lens, dict) and resolution is not ABSENT and f"{resolution}px" not in seq_lens:
        valid = ", ".join(k.removesuffix("px") for k in seq_lens)
        raise ConfigError(f"task.resolution={resolution} is not supported; valid: {valid} (e.g. task.resolution=32)")


def _check_folders(cfg: DictConfig, mode: str) -> None:
    # data_dir is checked first thing in prepare_data (after the run's record exists, which then says "failed")
    keys = {"train": ("results_dir", "checkpoint_dir"), "test": ("results_dir", "checkpoint_dir"),
            "bench": ("results_dir",), "report": ()}[mode]
    for key in keys:
        value = _select(cfg, f"paths.{key}")
        if value not in (ABSENT, None):
            ensure_writable(Path(str(value)), key.replace("_dir", " dir"))
    if mode == "report":
        out = _select(cfg, "report.out_dir")
        if out not in (ABSENT, None):
            ensure_writable(Path(str(out)), "report out dir")


# (attention class, setting) -> what a value that reaches the whole sequence turns the variant into
WHOLE_SEQUENCE = {
    ("attention.reformer.ReformerAttention", "bucket_size"): "one bucket holds every token: full attention, no hashing",
    ("attention.local.LocalAttention", "block_size"): "one block holds every token: full attention",
}


def _attention_problems(cfg: DictConfig) -> list[str]:
    """Attention settings that leave a variant without its mechanism (errors)."""
    target, window = _select(cfg, "attention._target_"), _select(cfg, "attention.window")
    if target == "attention.longformer.LongformerAttention" and isinstance(window, int) and 0 <= window < 2:
        return [f"attention.window={window} leaves longformer no sliding window (a token sees window // 2 = 0 "
                f"neighbours per side, only itself and the global first token); window is the total width, "
                f"e.g. attention.window=128"]
    return []


def _attention_warnings(cfg: DictConfig) -> list[str]:
    """Attention settings that are legal but turn a variant into another one."""
    target, max_len = _select(cfg, "attention._target_"), _select(cfg, "task.max_len")
    name = _select(cfg, "attention_name")
    name = target.rsplit(".", 1)[-1] if name in (ABSENT, None) else name
    found = []
    for (cls, key), what in WHOLE_SEQUENCE.items():
        value = _select(cfg, f"attention.{key}")
        if target == cls and isinstance(value, int) and isinstance(max_len, int) and value >= max_len:
            found.append(f"attention.{key}={value} >= task.max_len={max_len}: {what} (attention={name} measures "
                         f"nothing of its own here; use a {key} below max_len)")
    window = _select(cfg, "attention.window")
    if target == "attention.local.LocalAttention" and window == 0:
        found.append("attention.window=0: local attention without overlap (block-diagonal: a token never sees "
                     "past its own block of attention.block_size tokens); the default is attention.window=1")
    if (target == "attention.longformer.LongformerAttention" and isinstance(window, int) and isinstance(max_len, int)
            and window // 2 >= max_len - 1):
        found.append(f"attention.window={window} >= 2 x task.max_len={max_len}: every token sees the whole "
                     f"sequence, so longformer is full attention here")
    return found


def _warnings(cfg: DictConfig, mode: str) -> list[str]:
    found: list[str] = []
    if mode in ("train", "test"):
        found += _attention_warnings(cfg)
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


# ----------------------------------------------------------------------------- command line
def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    keys: list[str] = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            path = f"{prefix}{k}"
            keys.append(path)
            keys.extend(_flat_keys(node._get_node(k), path + "."))
    return keys


def suggest(wrong: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``wrong``: first among siblings (same parent), then anywhere. Names are
    compared by their last part: a shared prefix (``trainer.``) made ``trainer.accumulate_grad_batches``
    look like ``trainer.limit_val_batches``."""
    candidates = list(candidates)
    parent, _, leaf = wrong.rpartition(".")
    siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
    for pool in (siblings, candidates):
        leaves: dict[str, str] = {}
        for c in pool:
            leaves.setdefault(c.rpartition(".")[2], c)
        close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=SUGGEST_CUTOFF)
        if close:
            return leaves[close[0]]
    return None


def _trainer_parameters() -> set[str]:
    """The keyword parameters of Lightning's Trainer, read from its source (importing Lightning for
    one error message would take seconds; the import is the fallback)."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("pytorch_lightning")  # the top package only: nothing is imported
        tree = ast.parse((Path(spec.origin).parent / "trainer" / "trainer.py").read_text())
        init = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Trainer"
                    for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        return {a.arg for a in init.args.args + init.args.kwonlyargs} - {"self"}
    except Exception:  # noqa: BLE001 - another layout: ask the class itself
        from pytorch_lightning import Trainer

        return set(inspect.signature(Trainer.__init__).parameters) - {"self"}


def _group_choices(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_overrides(argv: list[str], conf_dir: Path) -> None:
    """Stage 1: group choices and setting names of ``python run.py ARGV``, before Hydra sees them.

    Only plain ``key=value`` overrides are checked (``+key`` adds, ``~key`` deletes, ``hydra.*`` is
    Hydra's own); a sweep ``a=x,y`` checks every choice. Runs with another config name are left to Hydra.
    """
    if any(a in ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir") or
           a.startswith(("--config-name=", "--config-path=", "--config-dir=")) for a in argv):
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if "=" in a and not a.startswith(("-", "+", "~", "hydra.", "hydra/"))]
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message says where
        return
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    group_sets: dict[str, list[str]] = {}
    values: list[tuple[str, str]] = []
    for ov, text in zip(parsed, plain):
        key = ov.key_or_group
        if key in groups or "/" in key or "@" in key:
            group = key.split("@")[0]
            if group not in groups:
                continue
            choices = [str(c) for c in ov.sweep_string_iterator()] if ov.is_sweep_override() else [ov.value()]
            valid = _group_choices(conf_dir, group)
            for choice in choices:
                if choice is not None and str(choice) != "null" and str(choice) not in valid:
                    close = difflib.get_close_matches(str(choice), valid, n=1)
                    raise ConfigError(f"unknown {group}={choice}: there is no config '{group}/{choice}'. "
                                      f"Available options: {', '.join(valid)}"
                                      + (f"; did you mean {group}={close[0]}?" if close else ""))
            group_sets[key] = [str(c) for c in choices]
        else:
            values.append((key, text))
    if not values:
        return
    known = _known_keys(conf_dir, group_sets)
    if not known:
        return
    for key, text in values:
        if key not in known and key.startswith("trainer.") and key.count(".") == 1 and \
                key.split(".", 1)[1] in _trainer_parameters():
            raise ConfigError(f"{key} is a Lightning Trainer setting that conf/trainer/ does not list; add it with "
                              f"+{text} (a leading +)")
        if key not in known:
            close = suggest(key, known)
            hint = f"did you mean {close}? " if close else ""
            raise ConfigError(f"unknown setting {key} (in '{text}'): {hint}No such key exists in the configuration"
                              f"{' of ' + ', '.join(f'{g}={c}' for g, cs in group_sets.items() for c in cs) if group_sets else ''}; "
                              f"to add a new key on purpose write +{text}")


def _known_keys(conf_dir: Path, group_sets: dict[str, list[str]]) -> set[str]:
    """Every key of the composed config, for each choice of each swept group (union)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    fixed = [f"{g}={cs[0]}" for g, cs in group_sets.items() if len(cs) == 1]
    variants = [fixed] + [[*(f for f in fixed if not f.startswith(g + "=")), f"{g}={c}"]
                          for g, cs in group_sets.items() if len(cs) > 1 for c in cs]
    known: set[str] = set()
    if GlobalHydra.instance().is_initialized():  # inside another Hydra app: leave it to Hydra
        return known
    for overrides in variants:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        known.update(_flat_keys(cfg))
    return known


# ----------------------------------------------------------------------------- build check
def _signature_keys(target: Any) -> set[str] | None:
    """Keyword names ``target`` accepts (following ``**kwargs`` up a class's bases); None = anything."""
    classes = inspect.getmro(target) if inspect.isclass(target) else (target,)
    names: set[str] = set()
    for cls in classes:
        fn = cls.__init__ if inspect.isclass(target) else cls
        if inspect.isclass(target) and "__init__" not in vars(cls):
            continue
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return None
        names.update(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return names - {"self"}
        if not inspect.isclass(target) or cls is object:
            return None
    return None


def _check_target_keys(node: Any, where: str) -> None:
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return
    from hydra.utils import get_object

    try:
        target = get_object(str(node._target_))
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{where}._target_={node._target_} cannot be imported ({type(e).__name__}: {e}); "
                          f"check the name") from None
    accepted = _signature_keys(target)
    if accepted is None:
        return
    if where == "trainer":
        from lra.training.compile import SUITE_TRAINER_KEYS

        accepted = accepted | set(SUITE_TRAINER_KEYS)
    for key in node.keys():
        if key in HYDRA_KEYS or key in accepted:
            continue
        close = suggest(f"{where}.{key}", [f"{where}.{a}" for a in accepted])
        raise ConfigError(f"unknown setting {where}.{key}: {node._target_} has no parameter '{key}'"
                          + (f"; did you mean {close}?" if close else "")
                          + f" (remove +{where}.{key} from the command line)")


def _explain(error: BaseException, cfg: DictConfig) -> ConfigError:
    """A constructor's complaint about its settings, as a ConfigError (keys named where they can be)."""
    from hydra.errors import InstantiationException

    cause, where = error, ""
    if isinstance(error, InstantiationException):
        text = str(error)
        where = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("full_key:")), "")
        cause = error.__cause__ or error
    message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if isinstance(cause, TypeError) and "unexpected keyword argument" in message:
        bad = message.rsplit("'", 2)[-2] if message.count("'") >= 2 else ""
        node = where or "optim"
        sub = OmegaConf.select(cfg, node) if node else None
        candidates = [f"{node}.{k}" for k in (sub.keys() if isinstance(sub, DictConfig) else [])]
        close = suggest(f"{node}.{bad}", [c for c in candidates if not c.endswith("." + bad)])
        return ConfigError(f"unknown setting {node}.{bad}" + (f"; did you mean {close}?" if close else "")
                           + f" (remove +{node}.{bad} from the command line)")
    return ConfigError(f"invalid setting{' under ' + where if where else ''}: {message}")


def check_build(cfg: DictConfig) -> list[str]:
    """Stage 3 (train/test): the devices, the network, the module and the DataModule, the data is
    there, the batch fits the training set, W&B can log. Returns the warnings (also logged)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from lra.data.cache import is_complete
    from lra.training.devices import check_devices
    from lra.training.train import build_module
    from lra.training.wandb_check import check_wandb

    for where in ("trainer",):
        _check_target_keys(cfg.get(where), where)
    for group in ("callbacks", "logger"):
        for name, node in (cfg.get(group) or {}).items():
            _check_target_keys(node, f"{group}.{name}")
    warnings = check_devices(OmegaConf.to_container(cfg.trainer, resolve=True))
    for message in warnings:
        log.warning(message)
    try:
        module = build_module(cfg)
        datamodule = instantiate(cfg.task.datamodule)
    except UserError:
        raise
    except (ValueError, TypeError, InstantiationException) as e:
        inner = e.__cause__ if isinstance(e, InstantiationException) else None
        if isinstance(inner, UserError):
            raise inner from None
        raise _explain(e, cfg) from e
    if cfg.get("ckpt_path"):
        from lra.training.resume import check_checkpoint

        check_checkpoint(module, cfg.ckpt_path)
    if not is_complete(datamodule.cache_dir):
        datamodule.check_sources()
    _check_batch_fits(cfg, datamodule)
    check_wandb(cfg)
    return warnings


def _train_size(datamodule: Any) -> tuple[int, str] | None:
    """The training set's size (exact once cached, planned for generated data), and its setting."""
    import numpy as np

    from lra.data.cache import is_complete
    from lra.data.layout import PATHFINDER_SPLIT

    labels = Path(datamodule.cache_dir) / "train_labels.npy"
    if is_complete(datamodule.cache_dir) and labels.is_file():
        return len(np.load(labels, mmap_mode="r")), "the cached training split"
    gen = getattr(datamodule, "gen", None)
    if getattr(datamodule, "source", None) != "generate" or not isinstance(gen, dict):
        return None
    if "n_train" in gen:
        return int(gen["n_train"]), "task.datamodule.generator.n_train"
    if "n_images" in gen:  # Pathfinder: LRA's train cut of the generated images
        share = PATHFINDER_SPLIT[0]
        return int(round(share * int(gen["n_images"]))), f"{share:.0%} of task.datamodule.generator.n_images"
    return None


def _check_batch_fits(cfg: DictConfig, datamodule: Any) -> None:
    """A batch larger than the training set repeats examples within every step: not a batch size."""
    size = _train_size(datamodule)
    batch = getattr(datamodule, "batch_size", None)
    if size is None or not isinstance(batch, int) or batch <= size[0]:
        return
    origin = _origin(cfg, "task.datamodule.batch_size")
    raise ConfigError(f"{origin}={batch} is larger than the training set ({size[0]} examples, {size[1]}): every "
                      f"batch would hold examples twice; use {origin}={size[0]} or less (e.g. {origin}=32), "
                      f"or more training data")


def full_error_wanted() -> bool:
    """``HYDRA_FULL_ERROR=1``: show the traceback of user errors too."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")
