"""Verify cost on the embedded target: one forward over k new tokens (tree mask) on top of a ~100-token
cache: the accelerated runtime (fastcpu) calibrated per row count, each fixed layout this machine offers for every row count
(nt, tn, wx, dnnl where torch exposes oneDNN's prepacked linear, and graph, the whole layer stack compiled by
inductor, where it is offered: compiled_body.target_layouts; the one-row compiled GEMV is only in the calibrated
runtime's choice; graph-fused, the graph with its fused verify graphs for the row counts in FUSED_ROWS), and HF
transformers, all in --dtype; and the calibrated runtime's greedy forward (argmax ids through the greedy
head it calibrated: screened_head.py), which is what greedy decoding runs. Interleaved rounds, medians,
ratio to the 1-token decode step of the same runtime. And the roofline (benchmarks/decoding/roofline.py): this
machine's streamed read bandwidth and oneDNN GEMM peak, sampled beside every k of every round, and from
them the fastest any k-row step could be, as a ratio to the calibrated runtime's measured 1-row step: a
verify-cost target below that floor cannot be met on this host.

    python -m benchmarks.decoding.bench_verify --rounds 8 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eaglewire.fastcpu.compiled_body import FUSED, FUSED_ROWS, GRAPH, target_layouts
from eaglewire.fastcpu.gemm import applies
from benchmarks.decoding.roofline import PEAK_ROWS, RateProbe, step_cost, widest_matrix
from eaglewire.fastcpu.runtime import FastRuntime
from eaglewire.hw import RUNTIME_DTYPES, describe_cpu, runtime_dtype
from eaglewire.safeio import atomic_write_text
from eaglewire import load_target
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

KS = (1, 2, 3, 4, 8, 16, 32, 64)
CACHED = 100  # tokens already in the KV cache when a verify runs


def _hf_verify(target, prefix: torch.Tensor, k: int) -> float:
    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    with torch.no_grad():
        target.model(input_ids=prefix, past_key_values=cache, use_cache=True)
        t0 = time.perf_counter()
        target.model(input_ids=torch.ones(1, k, dtype=torch.long), past_key_values=cache, use_cache=True)
    return time.perf_counter() - t0


def _roofline(target, probe: RateProbe, decode_ms: float) -> dict:
    """The rates sampled between the rounds' steps; the floor of each k-row step, in ms and as a ratio to
    the calibrated runtime's measured 1-row step (decode_ms)."""
    floor = {k: step_cost(target, k, CACHED).floor_s(probe.bandwidth, probe.peak) * 1e3 for k in KS}
    shape = probe.shape
    return {
        "bandwidth_gb_s": probe.bandwidth / 1e9,
        "gemm_peak_gflop_s": probe.peak / 1e9,
        "gemm_shape": f"[{PEAK_ROWS}, {shape[0]}] x [{shape[0]}, {shape[1]}]",
        "samples": len(probe.read_s),
        "floor_ms": floor,
        "floor_ratio_to_decode": {k: floor[k] / decode_ms for k in KS},
        "decode_ms": decode_ms,
    }


def _runtimes(target, layouts: tuple[str, ...]) -> dict[str, FastRuntime]:
    """A runtime per fixed layout, the graph with its fused verify graphs (FUSED), and a calibrated one that
    builds the fused graphs as a start asking for these verify sizes does (make_runtime, compile="always":
    a fused graph per size, kept where it times faster than the shared graph)."""
    runtimes = {f"lean_{lay}": FastRuntime(target, 256, layout=lay) for lay in layouts if applies(lay, 2)}
    fused_ks = tuple(k for k in KS if k in FUSED_ROWS)  # only the sizes timed here compile a fused graph
    if GRAPH in layouts:  # the graph with the fused verify graphs for those sizes, always
        runtimes[f"lean_{FUSED}"] = FastRuntime(target, 256, layout=GRAPH)
        runtimes[f"lean_{FUSED}"].graph.fused = set(fused_ks)
    calibrated = runtimes["lean_calibrated"] = FastRuntime(target, 256)
    print("calibrated layouts:", calibrated.calibrate(ks=KS))
    calibrated.settle_copies()  # the copies its policy reads, as make_runtime holds them before compiling
    calibrated.compile_graphs(verify_rows=fused_ks)
    print(
        "fused verify graphs (ms):",
        calibrated.fused_ms,
        "kept:",
        sorted(calibrated.graph.fused) if calibrated.graph else [],
    )
    for k, per_layout in calibrated.calibration_ms.items():
        print(f"  calibration, {k} rows:", " ".join(f"{lay} {ms:.1f}" for lay, ms in per_layout.items()))
    return runtimes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=RUNTIME_DTYPES, default="float32")
    ap.add_argument("--out", type=Path, default=run_dir("verify") / "verify.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = runtime_dtype(a.dtype)
    target = load_target(dtype=dtype)
    prefix = torch.randint(0, target.vocab_size, (1, CACHED), generator=torch.Generator().manual_seed(0))
    layouts = target_layouts(dtype)  # gemm's, plus compiled_body.GRAPH where it is offered
    runtimes = _runtimes(target, layouts)
    policy, fused_ms = runtimes["lean_calibrated"].policy, runtimes["lean_calibrated"].fused_ms
    for rt in runtimes.values():
        rt.forward(prefix, torch.arange(CACHED)[None], 0)

    probe = RateProbe(*widest_matrix(target), dtype=dtype)  # sampled beside every k of every round
    times: dict[str, dict[int, list[float]]] = {
        n: {k: [] for k in KS} for n in (*runtimes, "lean_calibrated_greedy", "hf")
    }
    for r in range(a.rounds):
        for k in KS:
            ids = torch.ones(1, k, dtype=torch.long)
            pos = torch.arange(CACHED, CACHED + k)[None]
            for name, rt in runtimes.items():
                t0 = time.perf_counter()
                rt.forward(ids, pos, CACHED)
                times[name][k].append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # what greedy decoding runs: argmax ids, the calibrated greedy head
            runtimes["lean_calibrated"].greedy(ids, pos, CACHED)
            times["lean_calibrated_greedy"][k].append(time.perf_counter() - t0)
            times["hf"][k].append(_hf_verify(target, prefix, k))
            probe.sample()
        print(
            f"round {r + 1}: "
            + " ".join(f"k{k}={statistics.median(times['lean_calibrated'][k]) * 1e3:.0f}ms" for k in KS),
            flush=True,
        )
    result: dict = {}
    for name, per_k in times.items():
        med = {k: statistics.median(v) * 1e3 for k, v in per_k.items()}
        result[name] = {"median_ms": med, "ratio_to_decode": {k: med[k] / med[1] for k in KS}}
    result["setup"] = {
        "rounds": a.rounds,
        "cache_tokens": CACHED,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": a.threads,
        "layouts": list(layouts),
        "calibrated": policy,
        "calibration_ms": runtimes["lean_calibrated"].calibration_ms,
        "fused_ms": fused_ms,
        "greedy_head": runtimes["lean_calibrated"].head_policy,
        "graph_gemm": runtimes["lean_calibrated"].graph_gemm,  # the graph's multi-row GEMM
        "graph_gemm_ms": runtimes["lean_calibrated"].graph_gemm_ms,
        "fused": "q/k/v and gate/up one GEMM each",
        "cpu": describe_cpu(),
    }
    result["roofline"] = _roofline(target, probe, result["lean_calibrated"]["median_ms"][1])
    atomic_write_text(a.out, json.dumps(result, indent=2))
    for name in times:
        print(name, {k: f"{result[name]['median_ms'][k]:.0f}ms x{result[name]['ratio_to_decode'][k]:.2f}" for k in KS})
    roof = result["roofline"]
    print(
        f"roofline: read {roof['bandwidth_gb_s']:.0f} GB/s, GEMM peak {roof['gemm_peak_gflop_s']:.0f} GFLOP/s "
        f"{roof['gemm_shape']}; floor",
        {k: f"{roof['floor_ms'][k]:.1f}ms x{roof['floor_ratio_to_decode'][k]:.2f}" for k in KS},
    )


if __name__ == "__main__":
    main()
