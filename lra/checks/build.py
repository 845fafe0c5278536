"""Stage 3 of the checks (train/test): build what the run will build, minus the data, so a mistake
costs the import of torch, not a data build. The devices (:mod:`lra.training.devices`); the network
and LightningModule, whose constructors validate the attention and model settings; the attention
variant's own word on its settings (:meth:`attention.base.Mixer.setting_problems` and
``setting_warnings``: a longformer ``window`` below 2 leaves it no sliding window, a reformer
``bucket_size`` that spans the whole sequence makes it full attention); the DataModule (then
``check_sources()``: external data present? a batch no larger than the training set?); ``ckpt_path``
loaded against the model; the keys of every ``_target_`` node that is built only later (trainer,
callbacks, loggers) against its signature (``+trainer.max_step=5`` would otherwise fail as a raw
``TypeError`` after data preparation); and that an online ``logger=wandb`` can log
(:mod:`lra.training.wandb_check`).
"""
from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra.badinput import ConfigError, UserError
from lra.checks.config import origin
from lra.checks.overrides import suggest

log = logging.getLogger(__name__)
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


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


def import_target(node: Any, where: str, fix: str = "check the name") -> Any:
    """The object ``node._target_`` names (None when ``node`` has no ``_target_``); one error line
    naming ``where`` when it cannot be imported."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    from hydra.utils import get_object

    try:
        return get_object(str(node._target_))
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{where}._target_={node._target_} cannot be imported ({type(e).__name__}: {e}); {fix}") from None


def _check_target_keys(node: Any, where: str) -> None:
    target = import_target(node, where)
    if target is None:
        return
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
    try:
        module = build_module(cfg)
        datamodule = instantiate(cfg.task.datamodule)
        if cfg.get("pretrain") is not None and cfg.mode == "train":
            from lra.training.pretrain import check_pretraining

            check_pretraining(cfg)
    except UserError:
        raise
    except (ValueError, TypeError, InstantiationException) as e:
        inner = e.__cause__ if isinstance(e, InstantiationException) else None
        if isinstance(inner, UserError):
            raise inner from None
        raise _explain(e, cfg) from e
    warnings += _variant_warnings(module, int(cfg.task.max_len))
    for message in warnings:
        log.warning(message)
    if cfg.get("ckpt_path"):
        from lra.training.resume import check_checkpoint

        check_checkpoint(module, cfg.ckpt_path)
    if not is_complete(datamodule.cache_dir):
        datamodule.check_sources()
    _check_batch_fits(cfg, datamodule)
    check_wandb(cfg)
    return warnings


def _variant_warnings(module: Any, max_len: int) -> list[str]:
    """What the attention variant says of its own settings (each layer's mixer, said once): problems
    end the run as one :class:`ConfigError`, warnings are returned."""
    from attention.base import Mixer

    mixers = [m for m in module.modules() if isinstance(m, Mixer)]
    problems = list(dict.fromkeys(p for m in mixers for p in m.setting_problems()))
    if problems:
        raise ConfigError("; ".join(problems) + ".")
    return list(dict.fromkeys(w for m in mixers for w in m.setting_warnings(max_len)))


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
    name = origin(cfg, "task.datamodule.batch_size")
    raise ConfigError(f"{name}={batch} is larger than the training set ({size[0]} examples, {size[1]}): every "
                      f"batch would hold examples twice; use {name}={size[0]} or less (e.g. {name}=32), "
                      f"or more training data")
