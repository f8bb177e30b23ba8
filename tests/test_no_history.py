"""No numbered work periods in the product: the README, docs, benchmarks and their result names, tests,
scripts and the package speak of "the shipped data" and "the released draft", with dates and hosts where a
measurement needs them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCANNED = ("README.md", "docs", "benchmarks", "tests", "scripts", "src", "mkdocs.yml")
WORDS = re.compile("sit" + "ting", re.IGNORECASE)  # spelled apart so this file passes its own scan


def _tracked() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "--", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("area", SCANNED)
def test_no_work_period_words(area: str) -> None:
    hits = []
    for name in _tracked():
        if not (name == area or name.startswith(area + "/")):
            continue
        if WORDS.search(name):
            hits.append(f"{name} (its name)")
        path = ROOT / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary (weights, pictures)
        hits += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if WORDS.search(line)]
    assert not hits, f"{len(hits)} work-period word(s), e.g. {hits[:10]}"
