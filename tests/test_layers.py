"""The layers of ``lra/`` (see its package docstring) hold in the imports, not only in the tree.

Every ``import`` statement is read, including those inside functions, so a lazy import cannot cross
a layer unseen.
"""
from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = {"badinput", "files", "identity", "records", "stamp", "footprint"}   # the modules at the top of lra/
MODEL_SIDE = {"models", "attention"}
OUR_PACKAGES = {"lra"} | MODEL_SIDE
# layer -> the layers (and model-side packages) its modules may import; its own layer is always allowed
MAY_IMPORT: dict[str, set[str]] = {
    "shared": {"shared"} | MODEL_SIDE,
    "checks": {"shared", "data", "training"} | MODEL_SIDE,  # run.py's checks before any work; only run.py imports them
    "data": {"shared"},
    "training": {"shared", "data"} | MODEL_SIDE,
    "bench": {"shared", "data"} | MODEL_SIDE,  # data: the approximation map captures ListOps inputs
    "report": {"shared"},
}
# within "shared", the report may read records and write files, nothing that pulls in the models
REPORT_SHARED = {"badinput", "files", "identity", "records", "stamp"}


def layer_of(module: str) -> str | None:
    """'lra.data.cache' -> 'data'; 'lra.records' -> 'shared'; 'models.network' -> 'models'."""
    parts = module.split(".")
    if parts[0] in MODEL_SIDE:
        return parts[0]
    if parts[0] != "lra" or len(parts) == 1:
        return None
    own_module = (ROOT / "lra" / parts[1]).is_dir() or (ROOT / "lra" / f"{parts[1]}.py").is_file()
    return parts[1] if own_module and parts[1] not in SHARED | {"__init__"} else "shared"  # or a name of lra/__init__.py


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from lra import x" may name a module (lra.x): keep the name, _module_of finds the module
            ours = node.module.split(".")[0] in OUR_PACKAGES
            found += [(node.lineno, f"{node.module}.{a.name}" if ours else node.module) for a in node.names]
    return found


def lra_modules() -> list[Path]:
    return sorted((ROOT / "lra").rglob("*.py"))


def test_every_lra_module_belongs_to_a_layer() -> None:
    top = {p.stem for p in (ROOT / "lra").glob("*.py")} - {"__init__"}
    assert top == SHARED, f"modules at the top of lra/ must be the shared ones {sorted(SHARED)}; move {sorted(top - SHARED)} into a layer"
    layers = {p.name for p in (ROOT / "lra").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert layers == set(MAY_IMPORT) - {"shared"}


@pytest.mark.parametrize("path", lra_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_layers(path: Path) -> None:
    own = layer_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
    allowed = MAY_IMPORT[own] | {own}
    wrong = []
    for line, module in imports_of(path):
        target = layer_of(module)
        if target is None:
            continue
        if target not in allowed:
            wrong.append(f"line {line}: {module} ({own} may import {sorted(allowed)})")
        elif own == "report" and target == "shared" and module.split(".")[1] not in REPORT_SHARED:
            wrong.append(f"line {line}: {module} (the report reads records; it may import lra.{sorted(REPORT_SHARED)})")
    assert not wrong, f"{path.relative_to(ROOT)} imports across its layer:\n" + "\n".join(wrong)


def test_models_and_attention_know_nothing_of_lra() -> None:
    wrong = [f"{p.relative_to(ROOT)}:{line}: {m}" for d in MODEL_SIDE for p in sorted((ROOT / d).rglob("*.py"))
             for line, m in imports_of(p) if layer_of(m) not in (None, *MODEL_SIDE)]
    assert not wrong, "models/ and attention/ must not import the benchmark (lra/):\n" + "\n".join(wrong)


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The checker itself can fail: a data module importing the report, inside a function, is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from lra.report import stats\n    import lra.training.train\n")
    found = [layer_of(m) for _, m in imports_of(bad)]
    assert found == ["report", "training"]
    assert not {"report", "training"} <= MAY_IMPORT["data"]


def _module_of(name: str) -> str | None:
    """The longest prefix of ``name`` that is a module of ours ('lra.bench.harness.measure' -> 'lra.bench.harness')."""
    parts = name.split(".")
    while parts:
        base = ROOT.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    """Our modules (lra/, models/, attention/) and the modules of ours each imports, lazy imports included."""
    graph: dict[str, set[str]] = {}
    for top in sorted(OUR_PACKAGES):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            targets = {_module_of(m) for _, m in imports_of(path) if m.split(".")[0] in OUR_PACKAGES}
            graph[name] = {t for t in targets if t and t != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules, the first repeated at the end), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        return e.args[1]
    return None


def test_no_import_cycles() -> None:
    """Not even through an import inside a function: a cycle means two modules each need the other."""
    found = cycle(import_graph())
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


def test_the_checker_sees_a_cycle() -> None:
    assert set(cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) or ()) == {"a", "b", "c"}
    assert cycle({"a": {"b"}, "b": set(), "d": {"a", "b"}}) is None
