"""Count how far the drafter-family and engine axes spread through src/ (issue 59's before -> after figures).

Parsed, never imported. Printed, one line each:
  tables   dict literals / comprehensions keyed by a family name ("eagle3", "dflash") outside families.py
  taps     places outside contract.py that say how an engine numbers taps: classes with a `convention`
           field and dicts whose values shift ids by an integer per rule
  taps-modules  modules outside contract.py naming a layer-id convention in code (e.g. "zlab", "sglang-plus1")
  files    modules holding a family name as a string constant (not a docstring): what a new family touches
  family-classes  classes named `Family`
Run: python scripts/family_spread.py [SRC]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FAMILY_NAMES = {"eagle3", "dflash"}
# unambiguous convention names (contract.CONVENTIONS less those that are also engine names)
CONVENTION_NAMES = {
    "zlab",
    "sglang-dflash",
    "vllm-dflash",
    "sglang-plus1",
    "sglang-first1",
    "sglang-final",
    "vllm-legacy",
    "modelopt",
}
NOT_FAMILY_TABLES = {"norms.py"}  # NORM_PRESETS: "eagle3" there names a norm preset, not a family


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _keys_family(node: ast.AST) -> bool:
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value in FAMILY_NAMES for k in node.keys)
    return False


# the contract's own modules: the conventions' records (conventions.py) and the one off-by-one (contract.py)
CONTRACT_MODULES = {"contract.py", "conventions.py"}


def scan(src: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"tables": [], "taps": [], "taps-modules": [], "files": [], "family-classes": []}
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(src))
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        if any(isinstance(n, ast.Constant) and n.value in FAMILY_NAMES and id(n) not in docs for n in ast.walk(tree)):
            found["files"].append(rel)
        if rel not in CONTRACT_MODULES and any(
            isinstance(n, ast.Constant) and n.value in CONVENTION_NAMES and id(n) not in docs for n in ast.walk(tree)
        ):
            found["taps-modules"].append(rel)
        for node in ast.walk(tree):
            if _keys_family(node) and not rel.endswith("families.py") and rel not in NOT_FAMILY_TABLES:
                found["tables"].append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.ClassDef):
                if node.name == "Family":
                    found["family-classes"].append(f"{rel}:{node.lineno}")
                fields = {
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
                if "convention" in fields and rel not in CONTRACT_MODULES:
                    found["taps"].append(f"{rel}:{node.lineno} class {node.name}")
            if (
                isinstance(node, ast.Dict)
                and node.keys
                and rel not in CONTRACT_MODULES
                and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys)
                and all(isinstance(v, ast.Constant) and type(v.value) is int for v in node.values)
                and any(
                    "sglang" in str(k.value) or "dflash" in str(k.value)
                    for k in node.keys
                    if isinstance(k, ast.Constant)
                )
            ):
                found["taps"].append(f"{rel}:{node.lineno} shift table")
    return found


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "src" / "eaglewire"
    for key, rows in scan(root).items():
        print(f"{key}: {len(rows)}")
        for row in rows:
            print(f"  {row}")
