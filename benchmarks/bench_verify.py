"""Verify cost on the embedded target: one forward over k new tokens (tree mask) on top of a ~100-token
cache: lean runtime calibrated per row count, each fixed layout, and HF transformers.
Interleaved rounds, medians, ratio to the 1-token decode step of the same runtime.

    python benchmarks/bench_verify.py --rounds 8 --out benchmarks/results/verify.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eaglewire.decoding.runtime import LeanTarget
from eaglewire.verifier.loader import load_target

KS = (1, 2, 3, 4, 8, 16, 32, 64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/verify.json"))
    a = ap.parse_args()
    torch.set_num_threads(2)
    target = load_target()
    prefix = torch.randint(0, 49152, (1, 100), generator=torch.Generator().manual_seed(0))
    runtimes = {f"lean_{lay}": LeanTarget(target, 256, layout=lay) for lay in ("nt", "tn", "wx")}
    runtimes["lean_calibrated"] = LeanTarget(target, 256)
    print("calibrated layouts:", runtimes["lean_calibrated"].calibrate(ks=KS))
    for rt in runtimes.values():
        rt.forward(prefix, torch.arange(100)[None], 0)
    from transformers import DynamicCache

    def hf_verify(k: int) -> None:
        cache = DynamicCache(config=target.model.config)
        with torch.no_grad():
            target.model(input_ids=prefix, past_key_values=cache, use_cache=True)
            t0 = time.perf_counter()
            target.model(input_ids=torch.ones(1, k, dtype=torch.long), past_key_values=cache, use_cache=True)
        return time.perf_counter() - t0

    times: dict[str, dict[int, list[float]]] = {n: {k: [] for k in KS} for n in (*runtimes, "hf")}
    for r in range(a.rounds):
        for k in KS:
            ids = torch.ones(1, k, dtype=torch.long)
            pos = torch.arange(100, 100 + k)[None]
            for name, rt in runtimes.items():
                t0 = time.perf_counter()
                rt.forward(ids, pos, 100)
                times[name][k].append(time.perf_counter() - t0)
            times["hf"][k].append(hf_verify(k))
        print(f"round {r + 1}: " + " ".join(f"k{k}={statistics.median(times['lean_calibrated'][k]) * 1e3:.0f}ms" for k in KS),
              flush=True)
    result = {}
    for name, per_k in times.items():
        med = {k: statistics.median(v) * 1e3 for k, v in per_k.items()}
        result[name] = {"median_ms": med, "ratio_to_decode": {k: med[k] / med[1] for k in KS}}
    result["setup"] = {"rounds": a.rounds, "cache_tokens": 100, "dtype": "float32", "threads": 2}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    for name in times:
        print(name, {k: f"{result[name]['median_ms'][k]:.0f}ms x{result[name]['ratio_to_decode'][k]:.2f}" for k in KS})


if __name__ == "__main__":
    main()
