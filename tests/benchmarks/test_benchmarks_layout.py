"""benchmarks/ is grouped by topic, and every command the project documents names a benchmark that exists: a
script moved or retired without its commands updated (README, docs, the results index and the results' own
notes, comments in src/) fails here, not in a reader's shell."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = re.compile(r"python -m (benchmarks(?:\.\w+)+)")
PATH = re.compile(r"(?<![\w/.])(benchmarks/(?!test_)[\w/.-]+\.(?:py|sh))\b")  # test_*: tests/benchmarks/' own


def _documented() -> list[tuple[str, str]]:
    """(file, what it names) for every benchmark command in a tracked text file."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".json", ".sh", ".txt", ".toml", ".yml", ".cpp") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [(name, m) for m in MODULE.findall(text) + PATH.findall(text)]
    return found


def test_every_documented_benchmark_command_names_an_existing_script():
    missing = []
    for name, target in _documented():
        rel = target.replace(".", "/") + ".py" if not target.endswith((".py", ".sh")) else target
        if not (ROOT / rel).is_file():
            missing.append(f"{name}: {target}")
    assert not missing, "commands naming no script (moved or retired without updating them): " + "; ".join(missing)


def test_benchmarks_are_grouped_by_topic_and_say_how_they_run():
    """Only the shared helper and the GPU check (its path is named in the developers' guide) stay at the top;
    every Python benchmark in a topic folder shows its own `python -m` command (or, for a script run in a
    client's venv, its path)."""
    top = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file())
    assert top == ["__init__.py", "gpu_train_check.py", "results_dir.py"], top
    silent = []
    for script in sorted((ROOT / "benchmarks").glob("*/*.py")):
        if script.parent.name == "results" or script.name == "__init__.py":
            continue
        module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
        text = script.read_text(encoding="utf-8")
        if f"python -m {module}" not in text and script.relative_to(ROOT).as_posix() not in text and "def main" in text:
            silent.append(module)
    assert not silent, f"benchmarks with no usage line naming their own command: {silent}"
