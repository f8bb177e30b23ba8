"""DFlash against EAGLE-3 on the embedded target at equal training compute: the training half of issue 47 item 7.

    python -m benchmarks.training.dflash_vs_eagle3                        # -> benchmarks/results/dflash/DATE-CPU/
    python -m benchmarks.training.dflash_vs_eagle3 --conversations 8 --steps 4 --block-sizes 4 --out /tmp/dfv  # smoke

Every arm trains with `eaglewire train` (one process, one thread each, arms run one after another) on the same
regenerated conversations (never evaluation prompts), the same held-out split, the same seed and batch size and
the same number of steps: `global_batches` is a pure function of (seed, samples), so every arm takes the same
batches in the same order and trains on exactly the same tokens. Wall time per arm is measured (training
steps, evaluation and checkpoints; the target's features are captured once per tap set beforehand and not
counted). `--match wall` instead gives each DFlash arm the number of steps that fits EAGLE-3's measured wall
time (from a short probe of that arm), so the two halves of "equal compute" can each be read.

Arms: `eagle3` (the default recipe for a new draft: eagle3.1 norms, reduced vocabulary, `--ttt-steps` deep TTT,
taps [2, L//2, L-3]) and `dflash-bB` for each block size B (full vocabulary, z-lab's five taps, `--dflash-layers`
layers, the block objective with its defaults). Per arm: wall seconds, trained tokens/s, and the held-out
teacher-forced acceptance the trainer reports: top-1 agreement per drafted position, the cumulative (chain)
acceptance, and tau_chain = 1 + sum(chain) — for EAGLE-3 a chain of `--ttt-steps` drafts anchored at every
position, for DFlash one block of B-1 drafts at random trained anchors.

With `--bench-prompts N` (item 7's decoding half) each DFlash arm's draft is then benchmarked beside the EAGLE-3
draft by `eaglewire bench` (one thread): vanilla, the EAGLE-3 chain and tree and DFlash, on N MT-bench first
turns spread over the categories, `--max-new-tokens` each: tau, per-position acceptance and median tokens/s
per method (OUT/bench-bB/bench.json; the medians in the table). Results: OUT/results.json and OUT/README.md
(the table and the command that made them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SOURCE = "smollm2-135m-sharegpt.jsonl.gz"  # target-regenerated ShareGPT conversations, shipped with eaglewire
CLI = (
    "import sys, torch; torch.set_num_threads(1); sys.argv = ['eaglewire'] + sys.argv[1:]; "
    "from eaglewire.cli.app import main; main()"
)


def run_cli(args: list[str], log: Path) -> float:
    """Run one `eaglewire` command on one thread, output to `log`; its wall seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call([sys.executable, "-c", CLI, *args], stdout=f, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        raise SystemExit(f"eaglewire {' '.join(args[:2])} failed (exit {code}); see {log}")
    return time.perf_counter() - t0


def prepare(a: argparse.Namespace) -> dict[str, Path]:
    """Features for each tap set (EAGLE-3's and DFlash's defaults) and EAGLE-3's vocab, from one sample set."""
    import eaglewire

    data = str(Path(eaglewire.__file__).parent / "assets" / "regenerated" / SOURCE)
    common = ["--data", data, "--limit", str(a.conversations), "--max-length", str(a.max_length)]
    paths = {"vocab": a.work / "vocab.safetensors"}
    if not paths["vocab"].exists():
        run_cli(["vocab", "build", *common, "--out", str(paths["vocab"])], a.work / "vocab.log")
    for family in ("eagle3", "dflash"):
        paths[family] = a.work / f"features-{family}"
        if not (paths[family] / "manifest.json").exists():
            run_cli(
                [
                    "data",
                    "capture",
                    *common,
                    "--family",
                    family,
                    "--target-dtype",
                    a.target_dtype,
                    "--out",
                    str(paths[family]),
                ],
                a.work / f"capture-{family}.log",
            )
    return paths


def arm_args(arm: str, paths: dict[str, Path], a: argparse.Namespace) -> list[str]:
    if arm == "eagle3":
        return ["--features", str(paths["eagle3"]), "--vocab", str(paths["vocab"]), "--ttt-steps", str(a.ttt_steps)]
    block = arm.removeprefix("dflash-b")
    return [
        "--features",
        str(paths["dflash"]),
        "--family",
        "dflash",
        "--block-size",
        block,
        "--num-layers",
        str(a.dflash_layers),
        "--anchors",
        str(a.anchors),
    ]


def train_arm(arm: str, steps: int, paths: dict[str, Path], a: argparse.Namespace, tag: str = "") -> dict:
    run = a.work / "runs" / f"{arm}-s{steps}{tag}"
    if not (run / "summary.json").exists():
        if run.exists():
            import shutil

            shutil.rmtree(run)  # an interrupted arm restarts: its wall time must be one uninterrupted run
        run.parent.mkdir(parents=True, exist_ok=True)
        wall = run_cli(
            [
                "train",
                *arm_args(arm, paths, a),
                "--out",
                str(run),
                "--max-steps",
                str(steps),
                "--batch-size",
                str(a.batch_size),
                "--eval-every",
                str(steps),
                "--ckpt-every",
                str(steps),
                "--seed",
                str(a.seed),
                "--heldout-fraction",
                str(a.heldout_fraction),
            ],
            run.with_suffix(".log"),
        )
        (run / "wall.json").write_text(json.dumps({"wall_s": wall}))
    summary = json.loads((run / "summary.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    train = [x for x in lines if x["split"] == "train"]
    held = summary["heldout"]
    return {
        "arm": arm,
        "steps": steps,
        "wall_s": json.loads((run / "wall.json").read_text())["wall_s"],
        "tok_per_s": train[-1]["tok_per_s"],
        "train_samples": summary["train_samples"],
        "taps": summary["contract"]["taps"],
        "loss_first": train[0]["loss"],
        "loss_last": train[-1]["loss"],
        "heldout_acc": held.get("acc"),
        "heldout_chain": held.get("chain"),
        "tau_chain": held.get("tau_chain"),
        "draft": str(run / "draft"),
    }


def matched_steps(arm: str, eagle_wall: float, paths: dict[str, Path], a: argparse.Namespace) -> int:
    """The steps of `arm` that take EAGLE-3's wall time, from a probe of `--probe-steps` steps."""
    probe = train_arm(arm, a.probe_steps, paths, a, tag="-probe")
    return max(1, round(eagle_wall / (probe["wall_s"] / a.probe_steps)))


def bench_arm(row: dict, eagle_draft: str, a: argparse.Namespace) -> dict:
    """`eaglewire bench` of this DFlash arm's draft beside the EAGLE-3 draft: {method: (tau, median tok/s)}."""
    out = a.out / f"bench-{row['arm']}"
    if not (out / "bench.json").exists():
        run_cli(
            [
                "bench",
                "--draft",
                eagle_draft,
                "--dflash-draft",
                row["draft"],
                "--methods",
                "vanilla,eagle_chain,eagle_tree,dflash",
                "--questions",
                "mtbench",
                "--limit",
                str(a.bench_prompts),
                "--max-new-tokens",
                str(a.max_new_tokens),
                "--out",
                str(out),
            ],
            a.work / f"bench-{row['arm']}.log",
        )
    methods = json.loads((out / "bench.json").read_text())["methods"]
    return {m: [r.get("tau"), r.get("median_tok_s")] for m, r in methods.items()}


def write(rows: list[dict], a: argparse.Namespace) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=2)
    )
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs or [])  # noqa: E731
    num = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731  (no held-out sample: no evaluation)
    table = [
        "| arm | steps | wall s | tok/s | loss first -> last | held-out acc per position | chain | tau_chain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['arm']} | {r['steps']} | {r['wall_s']:.0f} | {r['tok_per_s']:.0f} | {r['loss_first']:.3f} -> "
        f"{r['loss_last']:.3f} | {fmt(r['heldout_acc'])} | {fmt(r['heldout_chain'])} | {num(r['tau_chain'])} |"
        for r in rows
    ]
    cmd = "python -m benchmarks.training.dflash_vs_eagle3 " + " ".join(sys.argv[1:])
    decoded = [f"| {r['arm']} | {m} | {num(t)} | {num(s)} |" for r in rows for m, (t, s) in r.get("bench", {}).items()]
    if decoded:
        table += ["", "| arm | method | tau | median tok/s |", "|---|---|---|---|", *decoded]
    (a.out / "README.md").write_text(
        f"# DFlash vs EAGLE-3 at equal training compute ({a.match})\n\n    {cmd}\n\n" + "\n".join(table) + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/dflash/DATE-CPU")
    ap.add_argument("--work", type=Path, default=None, help="features and runs (default OUT/work)")
    ap.add_argument("--conversations", type=int, default=292, help="regenerated conversations (both arms)")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--target-dtype", default="bfloat16", help="the target's dtype while features are captured")
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps of every arm (equal tokens)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-fraction", type=float, default=0.05, help="held-out conversations (by id hash)")
    ap.add_argument("--ttt-steps", type=int, default=3, help="EAGLE-3's TTT depth (the released draft's)")
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--dflash-layers", type=int, default=1)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--match", choices=("tokens", "wall"), default="tokens")
    ap.add_argument("--probe-steps", type=int, default=10, help="--match wall: steps of each DFlash arm's probe")
    ap.add_argument("--bench-prompts", type=int, default=0, help="MT-bench questions decoded per DFlash arm (0: none)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    from benchmarks.results_dir import run_dir

    a.out = a.out or run_dir("dflash")
    a.work = a.work or a.out / "work"
    a.work.mkdir(parents=True, exist_ok=True)
    paths = prepare(a)
    rows = [train_arm("eagle3", a.steps, paths, a)]
    write(rows, a)
    for block in a.block_sizes:
        arm = f"dflash-b{block}"
        steps = a.steps if a.match == "tokens" else matched_steps(arm, rows[0]["wall_s"], paths, a)
        rows.append(train_arm(arm, steps, paths, a))
        if a.bench_prompts:
            rows[-1]["bench"] = bench_arm(rows[-1], rows[0]["draft"], a)
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "draft"}), flush=True)
        write(rows, a)
    print(f"-> {a.out / 'README.md'}")


if __name__ == "__main__":
    main()
