"""What checking the cached converted target costs: the sampled digest (every use) against the full sha256
(once per process), on the files of a cache directory, and the cost of a whole `is_complete` check.

    python -m benchmarks.architecture.cache_digest [--dir ~/.cache/eaglewire/targets/smollm2-135m] [--reps 5] [--out DIR]

Each figure is the median of --reps runs; the page cache is warm after the first (what a second command on
the same machine sees). Writes cache_digest.json to the run folder (benchmarks/results/cache/<date>-<cpu>/).
Nothing is written into the cache directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from eaglewire import cache
from eaglewire.hw import describe_cpu
from eaglewire.digests import full_digest, sampled_digest
from eaglewire.safeio import atomic_write_text
from benchmarks.results_dir import run_dir


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=cache.cache_root() / "targets" / "smollm2-135m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    files = [p for p in sorted(a.dir.rglob("*")) if p.is_file() and p.name != cache.MARKER]
    rows = {}
    for p in files:
        rows[p.name] = {
            "bytes": p.stat().st_size,
            "sampled_s": _median_s(lambda: sampled_digest(p), a.reps),
            "full_s": _median_s(lambda: full_digest(p), a.reps),
        }
        print(
            f"{p.name}: {rows[p.name]['bytes'] / 1e6:.1f} MB  sampled {rows[p.name]['sampled_s'] * 1e3:.2f} ms  "
            f"full {rows[p.name]['full_s'] * 1e3:.1f} ms"
        )
    total = {k: sum(r[k] for r in rows.values()) for k in ("bytes", "sampled_s", "full_s")}
    print(
        f"all files: sampled {total['sampled_s'] * 1e3:.2f} ms per use, full {total['full_s'] * 1e3:.1f} ms "
        f"once per process ({total['bytes'] / max(total['full_s'], 1e-9) / 1e9:.2f} GB/s)"
    )
    out = a.out or run_dir("cache")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / "cache_digest.json",
        json.dumps(
            {"dir": str(a.dir), "reps": a.reps, "files": rows, "total": total, "cpu": describe_cpu()},
            indent=2,
            default=str,
        )
        + "\n",
    )
    print(f"-> {out / 'cache_digest.json'}")


if __name__ == "__main__":
    main()
