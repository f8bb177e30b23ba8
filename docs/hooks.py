"""MkDocs hook: generate the reference pages from the code and the results tables from benchmarks/results
before every build, so neither can be stale (mkdocs.yml `hooks:`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).parent
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402
import gen_results  # noqa: E402


def on_pre_build(config: Any, **kwargs: Any) -> None:
    gen_reference.generate(DOCS / "reference")
    gen_results.generate()
