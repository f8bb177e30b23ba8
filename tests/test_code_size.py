"""The guide's size rule, held: every module of src/eaglewire under MAX_MODULE_LINES lines, every function (its
decorators to its last line, nested ones counted on their own too) under MAX_FUNCTION_LINES. A new offender fails
here: split it along a real seam (a module per responsibility, a helper per step), or add it below with the reason
it cannot be split cleanly."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Modules allowed over MAX_MODULE_LINES, path relative to src/ -> why it cannot be split cleanly. Empty: keep it so.
MODULE_ALLOW: dict[str, str] = {}
# Functions allowed over MAX_FUNCTION_LINES, "path relative to src/:qualified.name" -> why. Empty: keep it so.
FUNCTION_ALLOW: dict[str, str] = {}


def module_lines(text: str) -> int:
    """Lines as `wc -l` counts them (the guide's measure)."""
    return text.count("\n")


def long_functions(text: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """{qualified name: lines} of every function or method longer than `limit`, decorators included."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    lines = (child.end_lineno or child.lineno) - first + 1
                    if lines > limit:
                        found[name] = lines
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(text), "")
    return found


def _sources() -> dict[str, str]:
    return {p.relative_to(SRC).as_posix(): p.read_text() for p in sorted((SRC / "eaglewire").rglob("*.py"))}


def test_every_module_is_under_the_line_limit() -> None:
    over = {path: n for path, text in _sources().items() if (n := module_lines(text)) > MAX_MODULE_LINES}
    new = {path: n for path, n in over.items() if path not in MODULE_ALLOW}
    assert not new, f"modules over {MAX_MODULE_LINES} lines (split them, or allow one in MODULE_ALLOW with why): {new}"
    stale = sorted(set(MODULE_ALLOW) - set(over))
    assert not stale, f"MODULE_ALLOW names modules now under the limit (or gone): drop them: {stale}"


def test_every_function_is_under_the_line_limit() -> None:
    over = {f"{path}:{name}": n for path, text in _sources().items() for name, n in long_functions(text).items()}
    new = {key: n for key, n in over.items() if key not in FUNCTION_ALLOW}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (split them, or allow one in FUNCTION_ALLOW): {new}"
    stale = sorted(set(FUNCTION_ALLOW) - set(over))
    assert not stale, f"FUNCTION_ALLOW names functions now under the limit (or gone): drop them: {stale}"


def test_the_scan_finds_long_functions_methods_and_nested_ones() -> None:
    """The scan itself: a 61-line method and a nested function are found, by qualified name and with the
    decorator counted; a 60-line one is not."""
    body = "".join(f"        x{i} = {i}\n" for i in range(58))
    text = (
        f"class A:\n    @staticmethod\n    def long():\n{body}        return 0\n\n"  # 1 + 1 + 58 + 1 = 61 lines
        f"    def fits():\n{body}        return 0\n\n"  # 60 lines
        f"def outer():\n    def inner():\n{body.replace('        ', '            ')}"
        f"            return 1\n            return 2\n    return inner\n"
    )
    assert long_functions(text) == {"A.long": 61, "outer": 63, "outer.inner": 61}
    assert module_lines(text) == len(text.splitlines())
