"""No import cycles among the modules of the device package (``edgesdk``), read statically from the source.

Every ``import`` counts, also those inside functions (a lazy import still ties two modules together); only imports
under ``if TYPE_CHECKING:`` do not (they never run). An import names the most specific module it reaches:
``from .runtime.placement import Placement`` is an edge to ``edgesdk.runtime.placement``, ``from . import numerics``
one to ``edgesdk.runtime.numerics``, ``from .engines import open_engine`` one to the package ``edgesdk.engines`` (its
``__init__``). A package is not counted as importing its parent (Python runs the parent's ``__init__`` first, but
that one is already running or done, so no cycle can arise from it).

Nor among its sub-packages: with each module counted as ``edgesdk.<first component>`` (``edgesdk.runtime``,
``edgesdk.bundle``; a top-level module such as ``edgesdk.errors`` is a node of its own), the graph has no cycle, so
each sub-package sits above or below each other one (STYLE.md: the shared part of two is a module below both).
"""

from __future__ import annotations

import ast
from pathlib import Path

import edgesdk

ROOT = Path(edgesdk.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The edgesdk modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if _type_checking_only(node):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in modules else source)
    edges = set()
    for target in targets:
        while target and target not in modules:  # import a.b.c: the deepest edgesdk module it names
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module, as a path."""
    return [_path_through(sorted(c), graph) for c in _components(graph)]


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan): the groups that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _path_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A cycle inside ``component`` starting at its first module, for the failure message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_device_package_has_no_import_cycle():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles among edgesdk modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle_and_reads_relative_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "edgesdk.errors" in graph["edgesdk.bundle.reader"]  # from .errors import ...
    assert "edgesdk.runtime.numerics" in graph["edgesdk.runtime.precision_choice"]  # from . import autotune, numerics


def subpackage(module: str) -> str:
    """The node ``module`` counts under in the sub-package graph: ``edgesdk.<first component>`` (a sub-package, or a
    top-level module such as ``edgesdk.errors``); ``edgesdk`` itself for the package's ``__init__``."""
    return ".".join(module.split(".")[:2])


def subpackage_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """{(sub-package, sub-package it imports): the module-level imports that make that edge}. A package importing
    its parent (``edgesdk.runtime`` -> ``edgesdk``) is not counted, as in the module graph."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = subpackage(source), subpackage(target)
            if a != b and not a.startswith(b + "."):
                edges.setdefault((a, b), set()).add((source, target))
    return edges


def test_no_cycle_between_subpackages():
    edges = subpackage_edges(import_graph())
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    groups = [sorted(c) for c in _components(graph)]
    lines = []
    for members in groups:  # sub-packages that import each other: a cycle through them, then every import inside
        lines.append(" -> ".join(_path_through(members, graph)))
        for (a, b), made_by in sorted(edges.items()):
            if a in members and b in members:
                lines.append(f"  {a} -> {b}:")
                lines += [f"    {s} imports {t}" for s, t in sorted(made_by)]
    assert not groups, "import cycles between edgesdk sub-packages (the shared part belongs in a module below " \
                       "both):\n" + "\n".join(lines)


def test_the_subpackage_graph_collapses_modules_and_skips_parents():
    graph = {"edgesdk": {"edgesdk.runtime.loading"}, "edgesdk.runtime.loading": {"edgesdk.budgets.memory", "edgesdk"},
             "edgesdk.budgets.memory": {"edgesdk.errors", "edgesdk.budgets"}, "edgesdk.budgets": set(),
             "edgesdk.errors": set()}
    assert subpackage_edges(graph) == {
        ("edgesdk", "edgesdk.runtime"): {("edgesdk", "edgesdk.runtime.loading")},
        ("edgesdk.runtime", "edgesdk.budgets"): {("edgesdk.runtime.loading", "edgesdk.budgets.memory")},
        ("edgesdk.budgets", "edgesdk.errors"): {("edgesdk.budgets.memory", "edgesdk.errors")}}
