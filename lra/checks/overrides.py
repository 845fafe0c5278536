"""Stage 1 of the checks: ``python run.py ARGV`` before Hydra composes it (Hydra's override parser
and ``conf/`` only; no torch). An unknown group choice (``task=txt``) or a setting that does not exist
(``trainer.max_step=5``) gets the closest valid name (difflib over the config's keys) instead of
Hydra's advice to append ``+trainer.max_step``. :func:`suggest` is also how the later stages name
the closest key.
"""
from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig

from lra.badinput import ConfigError
from lra.identity import RETIRED

# 0.6 made accumulate_grad_batches "close" to limit_val_batches (ratio 0.600); real typos score >= 0.8
SUGGEST_CUTOFF = 0.65


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
    for a in argv:
        if "=" in a and (key := a.lstrip("+~").split("=", 1)[0]) in RETIRED:
            raise ConfigError(RETIRED[key])
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
    # a group added with +group=choice (+pretrain=mlm, +ablation=...): a known choice, and its keys are known
    added = [a.split(",")[0] for a in argv if a.startswith("+") and "=" in a and a[1:].split("=", 1)[0] in groups]
    for text in added:
        group, choice = text[1:].split("=", 1)
        valid = _group_choices(conf_dir, group)
        if choice not in valid:
            close = difflib.get_close_matches(choice, valid, n=1)
            raise ConfigError(f"unknown +{group}={choice}: there is no config '{group}/{choice}'. "
                              f"Available options: {', '.join(valid)}" + (f"; did you mean +{group}={close[0]}?" if close else ""))
    if not values:
        return
    known = _known_keys(conf_dir, group_sets, added)
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


def _known_keys(conf_dir: Path, group_sets: dict[str, list[str]], added: list[str] = ()) -> set[str]:
    """Every key of the composed config, for each choice of each swept group (union); ``added``:
    ``+group=choice`` overrides composed with every variant."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    fixed = [*added, *(f"{g}={cs[0]}" for g, cs in group_sets.items() if len(cs) == 1)]
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
