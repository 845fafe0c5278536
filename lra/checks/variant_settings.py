"""The attention variant's settings against its constructor, before any work (train, test, bench, check).

The rules are the variant's own signature: the type hints and defaults of its ``_target_`` class's
``__init__`` (``eps: float = 1e-6``, ``rates: Sequence[float]``, ``stride: int | None``), read with
:func:`typing.get_type_hints`; no second list of settings. A value of the wrong type gets one line
naming the key, the value, what is expected and an example (the variant's config value, else its
default), as the suite's own settings get from :mod:`lra.checks.config`; a key the class does not
take gets the closest one it does. Ranges and choices (``eps > 0``, ``feature_map`` in relu/elu/...)
stay with the constructor, which names the key itself (:func:`attention.base.require_positive`).
"""
from __future__ import annotations

import collections.abc
import inspect
import math
import types
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra.badinput import ConfigError
from lra.checks.build import HYDRA_KEYS, _signature_keys, import_target
from lra.checks.overrides import suggest

SHAPE_ARGS = {"self", "n_heads", "head_dim", "max_len", "layer_idx"}  # the shell passes these
NOT_CHECKED = object()                                              # a type this module has no rule for


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


SCALARS: dict[Any, tuple[Any, str]] = {
    int: (_is_int, "a whole number"),
    float: (_is_number, "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
}
SEQUENCES = {list, tuple, collections.abc.Sequence, typing.Sequence}


def expectation(hint: Any) -> tuple[Any, str] | object:
    """(test, words) for a type hint, or :data:`NOT_CHECKED` (a class of the variant's own, ``Any``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in SCALARS:
        return SCALARS[hint]
    if origin in (typing.Union, types.UnionType):
        parts = [expectation(a) for a in args if a is not type(None)]
        if any(p is NOT_CHECKED for p in parts):
            return NOT_CHECKED
        nullable = type(None) in args
        words = " or ".join(w for _, w in parts) + (" or null" if nullable else "")
        return (lambda v: (v is None and nullable) or any(t(v) for t, _ in parts)), words
    if origin in SEQUENCES or hint in SEQUENCES:
        item = args[0] if args else Any
        inner = expectation(item) if item is not Any and item is not Ellipsis else (lambda v: True, "anything")
        if inner is NOT_CHECKED:
            return NOT_CHECKED
        test, words = inner
        return (lambda v: isinstance(v, (list, tuple)) and all(test(x) for x in v)), \
            f"a list of {words.replace('a whole number', 'whole numbers').replace('a number', 'numbers').replace('a string', 'strings')}"
    return NOT_CHECKED


def _example(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"attention.{key}=[{','.join(str(v) for v in value)}]"
    if isinstance(value, bool):
        return f"attention.{key}={str(value).lower()}"
    if value is None:
        return f"attention.{key}=null"
    return f"attention.{key}={value}"


def _show(key: str, value: Any) -> str:
    return f"attention.{key}={value!r}" if isinstance(value, str) else f"attention.{key}={value}"


def check_variant_settings(cfg: DictConfig, conf_dir: Any = None) -> None:
    """Every setting of ``cfg.attention`` against its class's signature; every problem at once, as
    one :class:`ConfigError`."""
    from lra import CONF_DIR

    node = cfg.get("attention")
    target = import_target(node, "attention", "check the module and class name, e.g. "
                           "attention._target_=attention.softmax.SoftmaxAttention")
    if target is None:
        return
    init = target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(init)
        params = inspect.signature(init).parameters
    except Exception:  # noqa: BLE001 - a signature we cannot read: the constructor checks alone
        return
    name = OmegaConf.select(cfg, "attention_name", throw_on_resolution_failure=False)
    path = (conf_dir or CONF_DIR) / "attention" / f"{name}.yaml"
    shipped = OmegaConf.to_container(OmegaConf.load(path)) if name and path.is_file() else {}
    other_class = bool(shipped) and shipped.get("_target_") != node.get("_target_")  # attention._target_=my.Class
    values = OmegaConf.to_container(node, resolve=True)
    accepted = _signature_keys(target)
    problems = []
    for key, value in values.items():
        if key in HYDRA_KEYS or key in SHAPE_ARGS:
            continue
        if accepted is not None and key not in accepted:
            close = suggest(f"attention.{key}", [f"attention.{a}" for a in sorted(accepted - SHAPE_ARGS)])
            inherited = other_class and key in shipped
            problems.append(f"unknown setting attention.{key}: {node._target_} has no parameter '{key}'"
                            + (f" (it comes from conf/attention/{name}.yaml, written for {shipped['_target_']}; "
                               f"drop it with ~attention.{key})" if inherited else f"; did you mean {close}?" if close else ""))
            continue
        if isinstance(value, dict) and "_target_" in value:  # a nested object Hydra builds (ABC's tie)
            continue
        rule = expectation(hints[key]) if key in hints else NOT_CHECKED
        if rule is NOT_CHECKED:
            continue
        test, words = rule
        if test(value):
            continue
        default = params[key].default if key in params else inspect.Parameter.empty
        example_value = shipped[key] if key in shipped and not other_class else default
        example = f", e.g. {_example(key, example_value)}" \
            if example_value is not inspect.Parameter.empty and test(example_value) else ""
        problems.append(f"{_show(key, value)} is invalid: it must be {words} ({target.__name__}'s {key}){example}")
    if problems:
        raise ConfigError("; ".join(problems) + ".")
