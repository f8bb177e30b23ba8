"""Layers that only point down: no import cycle between modules, and packages in one written order.

The order below is the pipeline's, written once: a package (or top-level module) of eaglewire may import
only those before it. Counted for imports inside functions too.

A late import inside a function hides a cycle from Python (it works once both modules are loaded) but
not from a reader: the two modules can no longer be understood, tested or moved apart. Every module is
parsed (nothing is imported), every `eaglewire.*` import resolved to the module it loads, plus the
packages above it (importing `a.b.c` runs `a/__init__` and `a/b/__init__` first).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
ROOT = "eaglewire"

# base: errors, safe file IO, file digests, canonical records, guarded output writers, input limits, the user cache,
# CPU features, tensor ops, the tau formula -> the norm flags -> the drafter families -> what a valid tap list is ->
# the engines' layer-id conventions (what each can express) -> the wiring contract -> the target and the draft -> export
# (native checkpoint, engine records, formats) -> data -> the vLLM client -> capture -> train -> the speculative
# decoder -> its CPU acceleration -> each drafter family's decoding record (its proposer, export layout, default
# tree) -> decoding assembled (runtime choice, any draft directory) -> text generation (a chat prompt decoded:
# `eaglewire generate` and `ew.generate`) -> the doctor
# -> the workflows the CLI and `run` share (vocab, training, import) -> the Python front door (eaglewire.api) -> the
# product surfaces (bench, serve, peer rows) -> the `eaglewire run` pipeline -> the command line
LAYERS = (
    "about",
    "errors",
    "paths",
    "safeio",
    "digests",
    "records",
    "outputs",
    "limits",
    "cache",
    "hw",
    "ops",
    "tau",
    "norms",
    "families",
    "taps",
    "conventions",
    "contract",
    "target",
    "draft",
    "export",
    "data",
    "vllm_client",
    "capture",
    "train",
    "decoding",
    "fastcpu",
    "drafters",
    "compose",
    "generation",
    "doctor",
    "workflows",
    "api",
    "serve",
    "pipeline",
    "cli",
)
FRONT_DOOR = "api"  # what the root package re-exports (lazily, eaglewire/__init__.py's __getattr__), and no more
# The root package itself ranks with the front door it re-exports: a module that imports a name of `eaglewire`
# (not a submodule) may reach eaglewire.api through it, so only the layers above the front door may
ROOT_RANK = LAYERS.index(FRONT_DOOR)


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
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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
            names += [ROOT_NAME + "*" for a in node.names if a.name == ROOT]  # `import eaglewire`: its names
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]  # kept only where it is a module
            if base == ROOT:  # `from eaglewire import X`: the root package's own name X unless X is a module
                names += [ROOT_NAME + a.name for a in node.names]
        stack.extend(ast.iter_child_nodes(node))
    return names


ROOT_NAME = "<root>."  # marks a name of the root package itself (its __init__), not a submodule


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for name in _imports(ast.parse(path.read_text(), str(path)), mod, path.name == "__init__.py"):
            if name.startswith(ROOT_NAME):  # an edge to the root package unless the name is a submodule
                if f"{ROOT}.{name.removeprefix(ROOT_NAME)}" not in mods and mod != ROOT:
                    graph[mod].add(ROOT)
                continue
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
                return path[path.index(nxt) :] + [nxt]
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
    assert "eaglewire.workflows" in graph["eaglewire.pipeline.stages"]
    # compose imports the accelerated start only inside runtime()
    assert "eaglewire.fastcpu.start" in graph["eaglewire.compose"]


def test_cycle_finder_names_the_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_src():
    cycle = _find_cycle(_graph())
    assert cycle is None, (
        "import cycle: " + " -> ".join(cycle) + " (move the shared piece into a module "
        "both can import, or pass it in as an argument)"
    )


def _layer(module: str) -> str:
    """The top-level package or module of eaglewire that `module` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def package_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a later layer (or of an unlisted one), as 'module -> module'."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    rank[ROOT] = ROOT_RANK
    bad = []
    for mod, targets in sorted(graph.items()):
        a = _layer(mod)
        for target in sorted(targets):
            b = _layer(target)
            if a == ROOT and b in (FRONT_DOOR, LAYERS[0]):  # the lazy front door; the version and names it re-exports
                continue
            if a != b and (a not in rank or b not in rank or rank[b] > rank[a]):
                bad.append(f"{mod} -> {target}")
    return bad


def test_every_package_is_in_the_written_order():
    tops = {_layer(m) for m in _modules()} - {ROOT}
    assert tops == set(LAYERS), f"add {sorted(tops - set(LAYERS))} to LAYERS, drop {sorted(set(LAYERS) - tops)}"


def test_layers_only_point_down():
    bad = package_violations(_graph())
    assert not bad, "imports that point up the layers " + " > ".join(LAYERS) + ":\n  " + "\n  ".join(bad)


def test_the_layer_check_sees_an_upward_import():
    assert package_violations({"eaglewire.decoding.engine": {"eaglewire.fastcpu.gemm"}}) == [
        "eaglewire.decoding.engine -> eaglewire.fastcpu.gemm"
    ]
    assert package_violations({"eaglewire.fastcpu.gemm": {"eaglewire.decoding.layers"}}) == []
    assert package_violations({"eaglewire": {"eaglewire.api", "eaglewire.cli.app"}}) == [
        "eaglewire -> eaglewire.cli.app"
    ]
    # the root package is as high as the front door it re-exports: below it, importing it points up
    assert package_violations({"eaglewire.export.checkpoint": {"eaglewire"}, "eaglewire.cli.app": {"eaglewire"}}) == [
        "eaglewire.export.checkpoint -> eaglewire"
    ]


def test_the_graph_sees_imports_of_the_root_package():
    """`import eaglewire` and `from eaglewire import __version__` are edges to the root package (its __init__);
    `from eaglewire import hw` is an edge to the submodule only."""
    tree = ast.parse("import eaglewire\nfrom eaglewire import __version__, hw\n")
    names = _imports(tree, "eaglewire.export.checkpoint", False)
    assert ROOT_NAME + "__version__" in names and ROOT_NAME + "*" in names and "eaglewire.hw" in names
    graph = _graph()
    assert all(ROOT not in targets for mod, targets in graph.items() if _layer(mod) not in ("serve", "pipeline", "cli"))


def test_the_core_decoder_and_wiring_translate_load_no_acceleration_module():
    """Statically: nothing the decoder reaches is in fastcpu. At run time: `eaglewire wiring translate`
    loads none of fastcpu's modules (the package's own light __init__ at most)."""
    graph = _graph()
    seen, todo = set(), [m for m in graph if _layer(m) == "decoding"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not [m for m in seen if _layer(m) == "fastcpu"]
    code = (
        "import sys; from typer.testing import CliRunner; from eaglewire.cli.app import app; "
        "r = CliRunner().invoke(app, ['wiring', 'translate', '--layers', '30', '--to', 'vllm']); "
        "assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith('eaglewire.fastcpu.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
