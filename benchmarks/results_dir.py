"""Where a benchmark writes by default: benchmarks/results/<topic>/<date>-<cpu>[-<dtype>]/ (the layout
benchmarks/results/index.json and the docs' results pages are built from), so a new run never overwrites
the one a page cites."""

from __future__ import annotations

import datetime
from pathlib import Path

from eaglewire import hw

RESULTS = Path(__file__).parent / "results"


def cpu_slug() -> str:
    """'epyc-avx512', 'xeon-avx2', ...: the CPU's vendor family and the widest vector ISA torch uses."""
    model = hw.cpu_model().lower()
    family = next((n for n in ("epyc", "xeon", "ryzen", "core", "graviton", "neoverse") if n in model), "cpu")
    isa = str(hw.describe_cpu()["torch_capability"]).lower().replace("_", "")
    return f"{family}-{isa}"


def run_dir(topic: str, dtype: str | None = None, tag: str | None = None) -> Path:
    """A fresh run folder name for today on this CPU (not created)."""
    parts = [datetime.date.today().isoformat(), cpu_slug()] + [p for p in (dtype, tag) if p]
    return RESULTS / topic / "-".join(parts)
