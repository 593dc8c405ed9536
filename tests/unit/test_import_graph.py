"""No import cycles in core: every ``import`` statement (top level or inside a function) of every module
under ftx_triton is an edge, except those under ``if TYPE_CHECKING:`` (never executed); the package ``ftx_triton``
itself (a lazy façade) is left out as a target."""

from __future__ import annotations

import ast
from pathlib import Path

import ftx_triton

ROOT = Path(ftx_triton.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py") if "python_models" not in p.parts}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != "ftx_triton" and target != name:
                    graph[name].add(target)
    return graph


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except what sits under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_imports() -> None:
    graph = _graph()
    assert "ftx_triton.store.artifact_store" in graph["ftx_triton.engine.stages"]
    assert "ftx_triton.runtime.api" in graph["ftx_triton.engine.pipeline"]


def test_core_has_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_core_never_imports_its_default_plugins_for_logic() -> None:
    """pytest's model: default plugins are registered by name, never imported by the rest of core."""
    graph = _graph()
    plugin_modules = {m for m in graph if m.startswith("ftx_triton.engine.default_plugins") or m.endswith(".plugin")}
    users = {m: deps & plugin_modules for m, deps in graph.items() if deps & plugin_modules and m not in plugin_modules}
    assert users == {}
