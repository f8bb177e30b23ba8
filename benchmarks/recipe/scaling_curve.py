"""Data-scaling curve from one training pass: τ (chain k, greedy, same prompts) of each snapshot a run kept
(`eaglewire train --snapshot-steps ...`) against the tokens it had been trained on. In a run's first epoch
every batch is fresh data, so step N's draft has seen exactly the first N batches (data and compute grow
together; the lr schedule is the full run's, so early points are slightly pessimistic).

    python -m benchmarks.recipe.scaling_curve RUN_DIR --prompts 8 --max-new-tokens 128 --k 3 \\
        --out benchmarks/results/scaling/DATE-CPU
    python -m benchmarks.recipe.scaling_curve RUN_DIR --offline --prompts 16 --max-new-tokens 256 --also RELEASE

--offline scores every snapshot on the answers the bench's vanilla row decodes for those questions (decoded
once), walked round by round as a decoder walks a greedy k-chain (`heldout_gap.py`'s `tau_rounds`: on 2026-12-02
measured 1.989 this way against 1.995 online, 16 x 256): minutes per snapshot instead of a decode each, so a
curve can use the issue's knobs (16 questions x 256 tokens). Its second column is the teacher-forced
first-position agreement at every answer position (a token outside V_d a miss, as a decoder counts it), not
per round.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.hw import describe_cpu
from eaglewire.serve.bench import bench_prompts
import eaglewire as ew
from eaglewire.decoding.tree import TreeShape
from eaglewire import load_target
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/


def trained_tokens(metrics: Path) -> dict[int, int]:
    """step -> supervised positions (first TTT step) summed over steps 1..step, from metrics.jsonl."""
    total, out = 0, {}
    for line in metrics.read_text().splitlines():
        r = json.loads(line)
        if r["split"] == "train":
            total += r["positions"][0]
            out[r["step"]] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--also", type=Path, nargs="*", default=[], help="other drafts to measure (e.g. the released one)")
    ap.add_argument("--out", type=Path, default=run_dir("scaling"))
    ap.add_argument(
        "--offline",
        action="store_true",
        help="tau walked round by round on the vanilla answers (heldout_gap.py), not decoded per snapshot",
    )
    a = ap.parse_args()
    target = load_target()
    if a.offline:
        return _offline(a, target)
    prompts = bench_prompts(target, "mtbench", a.prompts)  # spread over MT-bench's categories
    seen, drafts = _snapshots(a)
    eos = {target.tokenizer.eos_token_id}
    rows = []
    for d in drafts:
        draft = load_checkpoint(d, target=target)
        st = ew.measure_tau(target, draft, prompts, TreeShape.chain(a.k), a.max_new_tokens, eos=eos)  # pooled
        acc = st.accepted
        step = _step(d, a.run, seen)
        row = {
            "draft": str(d),
            "step": step,
            "trained_tokens": seen.get(step) if step else None,
            "tau": st.tau,
            "per_position": st.per_position(a.k),
            "verify_steps": len(acc),
        }
        rows.append(row)
        print(json.dumps(row))
    _write(a, rows)


def _snapshots(a: argparse.Namespace) -> tuple[dict[int, int], list[Path]]:
    seen = trained_tokens(a.run / "metrics.jsonl")
    return seen, sorted((a.run / "snapshots").glob("step-*")) + [a.run / "draft"] + list(a.also)


def _step(d: Path, run: Path, seen: dict[int, int]) -> int | None:
    if d.name.startswith("step-"):
        return int(d.name.split("-")[1])
    return max(seen) if d == run / "draft" else None


def _offline(a: argparse.Namespace, target) -> None:
    from benchmarks.recipe.heldout_gap import agreement, bench_sample

    seen, drafts = _snapshots(a)
    samples = bench_sample(target, a.prompts, a.max_new_tokens)  # [prompt + vanilla answer] per question
    rows = []
    for d in drafts:
        r = agreement(load_checkpoint(d, target=target).float(), target, samples, a.k)
        step = _step(d, a.run, seen)
        row = {
            "draft": str(d),
            "step": step,
            "trained_tokens": seen.get(step) if step else None,
            "tau": r["tau_rounds"],
            "rounds": r["rounds"],
            "chain_every_position": r["chain"],
            "per_position": r["chain"][:1],
        }  # first-position agreement at every answer position, out-of-vocab a miss
        rows.append(row)
        print(json.dumps(row), flush=True)
    _write(a, rows)


def _write(a: argparse.Namespace, rows: list[dict]) -> None:
    how = (
        "offline: tau_rounds on the vanilla answers, heldout_gap.py"
        if a.offline
        else "online: SpecDecoder per snapshot"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    result = {
        "cpu": describe_cpu(),
        "prompts": a.prompts,
        "max_new_tokens": a.max_new_tokens,
        "k": a.k,
        "measured": how,
        "rows": rows,
    }
    (a.out / "scaling.json").write_text(json.dumps(result, indent=2))
    _plot(rows, a.out / "scaling.png", a.k, "agreement (every position)" if a.offline else "acceptance")


def _plot(rows: list[dict], png: Path, k: int, first: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted((r["trained_tokens"], r["tau"], r["per_position"][0]) for r in rows if r["trained_tokens"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogx([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"τ (chain k={k})")
    ax.semilogx([p[0] for p in pts], [1 + p[2] for p in pts], "s--", label=f"1 + first-position {first}")
    ax.set(xlabel="trained tokens (one pass, fresh data)", ylabel="τ", title="MT-bench turn 1, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
