"""Training throughput of eaglewire's trainer and speculators' (as `peer_training.py` runs them), measured
apart from the long comparison so that nothing else shares the machine: the same batches for each, one
thread each, the trainers alternating, `--reps` times. tok/s = trained tokens / training-loop seconds as
each trainer reports it (first step included for both); peak RSS of each process.

    python -m benchmarks.peer_training.peer_throughput --out benchmarks/results/peer_training/DATE-CPU --steps 32 --reps 2

Reads the features and vocab `peer_training.py` captured (run that first, same --work).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.peer_training.peer_training import (
    prepare,
    step_batches,
    target_settings,
    train_eaglewire,
    train_speculators,
)

from eaglewire.cache import cache_root  # noqa: E402
from eaglewire.hw import describe_cpu  # noqa: E402
from eaglewire.target.loader import load_target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=cache_root() / "peer_training")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--arms", default="eaglewire_eagle31,speculators")
    a = ap.parse_args()
    # peer_training's own settings, so its capture and vocab are reused
    a.base_steps, a.budgets, a.batch_size, a.max_length, a.ttt, a.heldout = a.steps, [1], 4, 512, 3, 32
    torch.set_num_threads(1)
    target = load_target()
    target_settings(a, target)
    feats, vocab, train, _ = prepare(a, target)
    batches = step_batches(train, a.steps, a)
    tokens = sum(len(s.input_ids) for b in batches for s in b)
    runs: dict[str, list[dict]] = {arm: [] for arm in a.arms.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for arm in runs if rep % 2 == 0 else list(runs)[::-1]:
                run = Path(tmp) / f"{arm}-{rep}"
                if arm == "speculators":
                    r = train_speculators(run, feats, vocab, [[s.id for s in b] for b in batches], a)
                else:
                    r = train_eaglewire(run, feats, vocab, a.steps, a, arm)
                runs[arm].append({"tok_per_s": round(r["tok_per_s"], 1), "peak_rss_mb": round(r["peak_rss_mb"])})
                print(arm, rep, runs[arm][-1], flush=True)
    med = {arm: statistics.median(x["tok_per_s"] for x in rs) for arm, rs in runs.items()}
    ratios = {arm: round(med[arm] / med["speculators"], 2) for arm in med if arm != "speculators"}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "throughput.json").write_text(
        json.dumps(
            {
                "cpu": describe_cpu(),
                "steps": a.steps,
                "tokens": tokens,
                "runs": runs,
                "median_tok_per_s": med,
                "ratio_to_speculators": ratios,
            },
            indent=2,
        )
        + "\n"
    )
    print(json.dumps({"median_tok_per_s": med, "ratio_to_speculators": ratios}))


if __name__ == "__main__":
    main()
