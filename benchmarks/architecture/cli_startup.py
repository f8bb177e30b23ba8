"""How long the command line takes to start, for two source trees side by side (interleaved, one run).

    python -m benchmarks.architecture.cli_startup --tree before=/path/to/old/src --tree after=src --reps 5

Times `python -c "import eaglewire.cli"` and `eaglewire wiring translate --layers 30 --to vllm` (a command
that needs no model: its cost is the imports) in fresh processes, alternating the trees so that a load
on the machine hits both alike. Writes startup.json (medians and every sample) to the run folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eaglewire.hw import describe_cpu
from eaglewire.safeio import atomic_write_text
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

COMMANDS = {
    "import eaglewire.cli": [sys.executable, "-c", "import eaglewire.cli"],
    "wiring translate": [
        sys.executable,
        "-m",
        "eaglewire.cli",
        "wiring",
        "translate",
        "--layers",
        "30",
        "--to",
        "vllm",
    ],
}


def wall(cmd: list[str], src: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=SRC_DIR (the folder holding eaglewire/)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    trees = dict(t.split("=", 1) for t in a.tree)
    samples = {name: {c: [] for c in COMMANDS} for name in trees}
    for _ in range(a.reps):
        for c, cmd in COMMANDS.items():
            for name, src in trees.items():
                samples[name][c].append(wall(cmd, src))
    medians = {name: {c: round(statistics.median(v), 3) for c, v in cs.items()} for name, cs in samples.items()}
    out = a.out or run_dir("architecture")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / "startup.json",
        json.dumps(
            {
                "setup": {"cpu": describe_cpu(), "reps": a.reps, "trees": trees},
                "median_s": medians,
                "samples_s": samples,
            },
            indent=1,
        ),
    )
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
