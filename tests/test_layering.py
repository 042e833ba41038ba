"""The package's layering, read from the source with ``ast`` (nothing is imported).

Every ``import``/``from ... import`` in every module counts, wherever it sits (module level, inside a
function, under ``TYPE_CHECKING``). A module may import its own top-level package or a lower layer;
sibling packages of layers 0 and 1 may import each other; ``train`` and ``plan`` may not. There must
be no cycle among modules, nor among top-level packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "cmdare"

# Top-level package (or module) under cmdare -> layer, low to high.
LAYERS: dict[str, int] = {
    "cmdare": 0,  # cmdare/__init__.py
    "cmdare.errors": 0,
    "cmdare.paths": 0,
    "cmdare.file_cache": 0,
    "cmdare.output_files": 0,
    "cmdare.option_values": 0,
    "cmdare.public_data": 0,
    "cmdare.events": 0,
    "cmdare.console": 0,
    "cmdare.workloads": 1,
    "cmdare.datasets": 1,
    "cmdare.tasks": 1,
    "cmdare.ps": 1,
    "cmdare.cloud": 1,
    "cmdare.collective": 1,
    "cmdare.storage": 1,
    "cmdare.measure": 2,
    "cmdare.predict": 3,
    "cmdare.control": 4,
    "cmdare.train": 5,
    "cmdare.plan": 5,
    "cmdare.cli": 6,
    "cmdare.run_simulation": 6,  # train --simulate: a train command line through the planner
}
SIBLING_LAYERS = {0, 1}  # layers whose packages may import each other (without cycles)


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module under src/cmdare."""
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The cmdare modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m == ROOT or m.startswith(ROOT + ".")}


def _known(name: str) -> str:
    """The longest existing module that ``name`` lies in (a missing name resolves to its parent)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _top(name: str) -> str:
    """The top-level package (or module) under cmdare that ``name`` belongs to."""
    return ".".join(name.split(".")[:2])


GRAPH: dict[str, set[str]] = {m: {_known(t) for t in _imports(m, p)} - {m} for m, p in MODULES.items()}
EDGES: dict[str, set[str]] = {m: _imports(m, p) - {m} for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (or with a self-loop), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _allowed(importer: str, imported: str) -> bool:
    src, dst = _top(importer), _top(imported)
    if src not in LAYERS or dst not in LAYERS:
        return False
    if src == dst:
        return True
    if {src, dst} == {"cmdare.train", "cmdare.plan"}:
        return False
    a, b = LAYERS[src], LAYERS[dst]
    return b < a or (a == b and a in SIBLING_LAYERS)


def test_the_graph_is_read() -> None:
    assert len(MODULES) > 50
    assert {"cmdare.events", "cmdare.measure.store.schema"} <= GRAPH["cmdare.measure.recorder"]
    assert "cmdare.ps.placement" in GRAPH["cmdare.ps.psld.load"]  # an absolute import
    lazy = GRAPH["cmdare.workloads.registry"]  # the zoo is imported inside a function
    assert "cmdare.workloads.zoo" in lazy


def test_every_package_has_a_layer() -> None:
    missing = sorted({_top(m) for m in MODULES} - set(LAYERS))
    assert not missing, f"add these to LAYERS in {Path(__file__).name}: {missing}"


def test_no_upward_imports() -> None:
    bad = sorted(f"{m} -> {t}" for m, targets in EDGES.items() for t in targets if not _allowed(m, t))
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)


def test_no_module_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "module import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_no_package_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        graph.setdefault(_top(m), set()).update(_top(t) for t in targets if _top(t) != _top(m))
    cycles = _cycles(graph)
    assert not cycles, "package import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(("importer", "imported", "ok"), [
    ("cmdare.measure.recorder", "cmdare.events", True),
    ("cmdare.measure.recorder", "cmdare.train.callbacks", False),
    ("cmdare.cloud.local", "cmdare.predict", False),
    ("cmdare.workloads.profile", "cmdare.datasets.base", True),  # layer-1 siblings
    ("cmdare.train.ps.placement_changes", "cmdare.plan.bottleneck", False),  # same layer, not siblings
    ("cmdare.plan.adapters", "cmdare.train.spec", False),
    ("cmdare.control.kernel", "cmdare.predict", True),
    ("cmdare.cli", "cmdare.train.cli.train_cmd", True),
    ("cmdare.ps.psld.load", "cmdare.ps.placement", True),
])
def test_the_rule(importer: str, imported: str, ok: bool) -> None:
    assert _allowed(importer, imported) is ok


def test_cycles_are_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
