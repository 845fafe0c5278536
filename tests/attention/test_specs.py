"""Every config's spec (attention/spec.py, a ``spec = Spec(...)`` next to its class) is complete and
agrees with its YAML: the settings grid has a table for every key, ranges, knobs and fixed overrides
name keys the YAML has, the peers name adapters of lra/bench/peers.py. A spec that lacks a field
fails with one line naming the field and the file to edit."""
from __future__ import annotations

import pytest

import lra.bench.peers as bp
from attention.base import Mixer
from attention.registry import variant_names
from attention.softmax import SoftmaxAttention
from attention.spec import REQUIRED, Grid, Spec, class_of, config_values, problem, spec_of, spec_problem, where


def _spec(name: str) -> Spec:
    line = spec_problem(name)
    if line:
        pytest.fail(line, pytrace=False)
    return spec_of(name)


@pytest.mark.parametrize("name", variant_names())
def test_spec_is_complete(name):
    _spec(name)


@pytest.mark.parametrize("name", variant_names())
def test_spec_agrees_with_the_yaml(name):
    spec, keys, cls = _spec(name), config_values(name), class_of(name)
    owner = f"{where(cls)}: {cls.__name__}.spec"
    lines = [f"conf/attention/{name}.yaml exposes {k!r}, which {owner}.grid has no table for"
             for k in keys if k not in spec.grid.tables]
    lines += [f"{owner}.grid.tables[{k!r}] is empty" for k, v in spec.grid.tables.items() if not v]
    lines += [f"{owner}.ranges names {k!r}, which {name}.yaml does not expose" for k in spec.ranges
              if k not in spec.grid.tables]
    lines += [f"{owner}.knobs names {k.key!r}, which {name}.yaml does not expose (give the knob a to_overrides)"
              for k in spec.knobs if k.to_overrides is None and k.key not in keys]
    lines += [f"{owner}.{field} names {k!r}, which {name}.yaml does not expose"
              for field in ("fixed", "train_noise_off") for k in getattr(spec, field) if k not in keys]
    if spec.grid.size is not None and spec.grid.size not in spec.grid.tables:
        lines.append(f"{owner}.grid.size {spec.grid.size!r} is no table of the grid")
    if not callable(spec.documented):
        lines += [f"{owner}.documented names {k!r}, which {name}.yaml does not expose" for k in spec.documented
                  if k not in keys]
    if spec.representative is not None and (spec.representative not in variant_names()
                                            or class_of(spec.representative) is not cls):
        lines.append(f"{owner}.representative {spec.representative!r} is no config of {cls.__name__}")
    for peer in spec.peers:
        for adapter in (peer.build, peer.align):
            if adapter is not None and not callable(getattr(bp, adapter, None)):
                lines.append(f"{owner}.peers names {adapter!r}, which lra/bench/peers.py does not define")
        if peer.config not in variant_names() or class_of(peer.config) is not cls:
            lines.append(f"{owner}.peers races {peer.config!r}, which is no config of {cls.__name__}")
    if not callable(spec.draws) and not isinstance(spec.draws, bool):
        lines.append(f"{owner}.draws is {spec.draws!r}: a bool or a function of the settings")
    assert not lines, "\n".join(lines)


def test_an_incomplete_spec_names_the_field_and_the_file():
    class Cosine(Mixer):
        spec = Spec(grid=Grid({}), ranges={}, draws=False, small={})

    class Bare(Mixer):
        pass

    class Child(SoftmaxAttention):   # a subclass writes its own spec: it is another method
        pass

    here = "tests/attention/test_specs.py"
    assert problem(Cosine) == (f"{here}: Cosine.spec lacks 'knobs' (the approximation map's budget axes; () for none)")
    assert problem(Bare).startswith(f"{here}: Bare has no spec")
    assert problem(Child).startswith(f"{here}: Child has no spec")
    assert problem(SoftmaxAttention) is None
    for field in REQUIRED:
        kept = {f: v for f, v in dict(grid=Grid({}), ranges={}, knobs=(), draws=False, small={}).items() if f != field}
        cls = type("Partial", (Mixer,), {"spec": Spec(**kept)})
        assert problem(cls) == f"{here}: Partial.spec lacks {field!r} ({REQUIRED[field]})"


def test_per_config_entries_override_the_class():
    spec = class_of("performer").spec
    assert spec_of("performer").knobs == spec.knobs
    assert spec_of("performer_32").knobs != spec.knobs and max(spec_of("performer_32").knobs[0].values) == 256
