"""The GEMMs alone: one pass over the embedded target's 120 layer weights (q/k/v and gate/up fused, as the
accelerated runtime holds them) at k rows, per eager layout this machine offers (gemm.candidate_layouts: tn, nt,
dnnl, panel, panel-avx512 where offered), beside a plain sum over the same bytes (the memory's pace). Layouts interleaved within each
repetition, medians; fp32. What a verify of k tokens must pay for its GEMMs, without the rest of the step
(bench_verify.py times whole steps).

    python -m benchmarks.decoding.bench_gemm --reps 11
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eaglewire.fastcpu.gemm import PACKED, PANELS, candidate_layouts
from eaglewire.fastcpu.runtime import FastRuntime
from eaglewire.hw import describe_cpu
from eaglewire.safeio import atomic_write_text
from eaglewire import load_target
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

ROWS = (1, 2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(("tn", PACKED, *PANELS)), help="comma-separated, those offered here")
    ap.add_argument("--out", type=Path, default=run_dir("verify", "fp32") / "gemm.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    offered = candidate_layouts(torch.float32, compiled=True)
    layouts = [lay for lay in a.layouts.split(",") if lay in offered]
    rt = FastRuntime(load_target(dtype=torch.float32), 8, layout="tn", compiled=True)
    lins = [lin for L in rt.layers for lin in (L.qkv, L.o, L.gate_up, L.down)]
    flat = torch.cat([lin.w.flatten() for lin in lins])  # the same bytes in one buffer, for the sum
    nbytes = flat.numel() * flat.element_size()
    times: dict[str, dict[int, list[float]]] = {n: {k: [] for k in ROWS} for n in ("sum", *layouts)}
    for k in ROWS:
        xs = {lin.w.shape[1]: torch.randn(1, k, lin.w.shape[1]) for lin in lins}  # [1, k, in]
        for lay in layouts:  # untimed first pass: page faults, kernel choice
            for lin in lins:
                lin(xs[lin.w.shape[1]], lay)
        for _ in range(a.reps):
            t0 = time.perf_counter()
            flat.sum()
            times["sum"][k].append(time.perf_counter() - t0)
            for lay in layouts:
                t0 = time.perf_counter()
                for lin in lins:
                    lin(xs[lin.w.shape[1]], lay)
                times[lay][k].append(time.perf_counter() - t0)
        print(
            f"{k:>2} rows: " + " ".join(f"{n} {statistics.median(v[k]) * 1e3:.2f} ms" for n, v in times.items()),
            flush=True,
        )
    result = {n: {"median_ms": {k: statistics.median(v) * 1e3 for k, v in per_k.items()}} for n, per_k in times.items()}
    result["setup"] = {
        "weights": len(lins),
        "bytes": nbytes,
        "reps": a.reps,
        "threads": a.threads,
        "dtype": "float32",
        "cpu": describe_cpu(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out, json.dumps(result, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
