"""No import cycle anywhere in src/eaglewire, counting imports inside functions.

A late import inside a function hides a cycle from Python (it works once both modules are loaded) but
not from a reader: the two modules can no longer be understood, tested or moved apart. Every module is
parsed (nothing is imported), every `eaglewire.*` import resolved to the module it loads, plus the
packages above it (importing `a.b.c` runs `a/__init__` and `a/b/__init__` first).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
ROOT = "eaglewire"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names the module imports, relative ones resolved; `if TYPE_CHECKING:` blocks never run."""
    names: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]  # kept only where it is a module
        stack.extend(ast.iter_child_nodes(node))
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for name in _imports(ast.parse(path.read_text(), str(path)), mod, path.name == "__init__.py"):
            if not (name == ROOT or name.startswith(ROOT + ".")):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the module and every package above it
                target = ".".join(parts[:i])
                if target in mods and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the DFS path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_late_imports():
    """The walk must see imports inside functions, or the test below proves nothing."""
    graph = _graph()
    assert "eaglewire.cli.app" in graph and "eaglewire.cli.common" in graph["eaglewire.cli.data"]
    # stages.py imports the workflows only inside its stage functions
    assert "eaglewire.pipeline.workflows" in graph["eaglewire.pipeline.stages"]


def test_cycle_finder_names_the_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_src():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle) + " (move the shared piece into a module " \
        "both can import, or pass it in as an argument)"
