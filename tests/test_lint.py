"""The linter and the formatter as tests: `ruff check .` and `ruff format --check .` (the whole tree: src, tests,
benchmarks, scripts, docs) pass with the configuration in pyproject.toml ([tool.ruff]). A change that is not
formatted fails here; `ruff format` formats it.

ruff comes with the dev extra; where it is not installed the test skips (CI installs the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _ruff() -> list[str] | None:
    try:
        import ruff  # noqa: F401  the dev extra's

        return [sys.executable, "-m", "ruff"]
    except ImportError:
        exe = shutil.which("ruff")
        return [exe] if exe else None


def test_the_configuration_is_the_one_in_pyproject():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert conf["line-length"] >= 100 and {"E9", "F"} <= set(conf["lint"]["select"])
    assert conf["format"]["skip-magic-trailing-comma"] is True  # the size rule counts lines
    assert any(
        dep.startswith("ruff")
        for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    )


def test_ruff_check_passes_on_the_tree():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    out = subprocess.run(
        [*ruff, "check", ".", "--output-format", "concise"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_leaves_the_tree_unchanged():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    out = subprocess.run([*ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, "run `ruff format` (files it would change):\n" + out.stdout[-4000:] + out.stderr[-2000:]
