"""Which training recipe buys the most draft accuracy per CPU second? Short runs from scratch, one lever each.

    python -m benchmarks.recipe.recipe_ablation FEATURES VOCAB --vocab16k VOCAB16K --steps 150

Every run trains on the same first `--train-limit` samples of FEATURES with the same held-out split, seed and
schedule; only the named lever differs. Reported: held-out top-1 agreement per TTT position at the end, the
wall time and training tokens/s — side by side in one session on one CPU (stated in the output). Runs live in
~/.cache/eaglewire/recipe/NAME and a finished one is not rerun (delete it to measure again).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from eaglewire.cache import cache_root
from eaglewire.hw import describe_cpu
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

LEVERS: dict[str, list[str]] = {
    "base": [],  # 1 layer, V_d 8000, TTT 3, lr 1e-3 (the release's recipe)
    "layers2": ["--num-layers", "2"],
    "init_from_target": ["--init-layers-from-target"],
    "vocab16k": [],  # --vocab replaced by the 16k map
    "ttt1": ["--ttt-steps", "1"],
    "lr3e-3": ["--lr", "3e-3"],
    "supervise_all": ["--supervise", "all"],  # prompt tokens supervised too
    "lk_hybrid": ["--loss", "lk_hybrid"],  # KL blended into TV by the overlap (LK losses)
    "nla": ["--loss", "nla"],  # -log(overlap) (LK losses)
    "greedy_ce": ["--loss", "greedy_ce"],  # CE on the target's top-1: what greedy verification accepts
    # TTT 1 costs ~1/3 of TTT 3 per step (bench_recipe_cost.py): 3x the steps for the same CPU time, first
    # position only (the later --max-steps wins over the base's)
    "ttt1_same_cpu": ["--ttt-steps", "1", "--max-steps", "450"],
    "raw_mix": [],  # half the samples regenerated (first train_limit/2), half ShareGPT's own answers (--raw)
    "raw_only": [],  # ShareGPT's own answers only, scored by the target; held-out stays regenerated
}


def lever_args(name: str, args: argparse.Namespace) -> list[str]:
    """The command-line difference of one lever from the base run."""
    if name == "vocab16k":
        return ["--vocab", str(args.vocab16k)]
    if name in ("raw_mix", "raw_only"):
        if args.raw is None:
            raise SystemExit(f"lever {name} needs --raw FEATURES (benchmarks/recipe/raw_text_features.sh)")
        keep = args.train_limit // 2 if name == "raw_mix" else 0
        return ["--train-limit", str(keep), "--also-features", str(args.raw)]
    return LEVERS[name]


def run_one(name: str, args: argparse.Namespace) -> dict:
    out = cache_root() / "recipe" / name
    summary = out / "summary.json"
    if not summary.exists():
        base = {"--vocab": str(args.vocab), "--train-limit": str(args.train_limit), "--ttt-steps": "3"}
        extra = lever_args(name, args)
        flags = [a for a in extra if a.startswith("--")]
        defaults = [x for k, v in base.items() if k not in flags for x in (k, v)]  # those the lever keeps
        cmd = [
            "eaglewire",
            "train",
            "--features",
            str(args.features),
            "--out",
            str(out),
            "--max-steps",
            str(args.steps),
            "--batch-size",
            str(args.batch_size),
            "--warmup-steps",
            "20",
            "--eval-every",
            str(args.steps),
            "--ckpt-every",
            str(args.steps),
            *defaults,
            *extra,
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (out / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    s = json.loads(summary.read_text())
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l]
    train_rows = [r for r in rows if r["split"] == "train"]
    return {
        "name": name,
        "args": [a.replace(str(cache_root()), "~cache") for a in lever_args(name, args)],
        "heldout_acc": [round(a, 4) for a in s["heldout"]["acc"]],
        "wall_s": float((out / "wall_s.txt").read_text()),
        "tok_per_s": round(train_rows[-1]["tok_per_s"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("features", type=Path)
    ap.add_argument("vocab", type=Path)
    ap.add_argument("--vocab16k", type=Path, required=True)
    ap.add_argument("--raw", type=Path, help="features of ShareGPT's own answers (for raw_mix, raw_only)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--train-limit", type=int, default=2600)
    ap.add_argument("--only", default="", help="comma list of levers (default: all)")
    ap.add_argument("--out", type=Path, default=run_dir("recipe"))
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(LEVERS)
    results = []
    for name in names:
        results.append(run_one(name, args))
        print(json.dumps(results[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "cpu": describe_cpu(),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "train_limit": args.train_limit,
        "results": results,
    }
    (args.out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    cpu = record["cpu"]
    where = f"{cpu['model']}, {cpu['threads']} threads, native bf16 {cpu['native_bf16']}"
    lines = [
        f"# Recipe levers, {args.steps} steps x batch {args.batch_size} from scratch ({where})",
        "",
        "| lever | held-out top-1 per TTT position | wall s | train tok/s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['name']} {' '.join(r['args'])} | {' / '.join(f'{a:.3f}' for a in r['heldout_acc'])} | "
        f"{r['wall_s']:.0f} | {r['tok_per_s']} |"
        for r in results
    ]
    (args.out / "recipe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
