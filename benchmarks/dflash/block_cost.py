"""What a DFlash round costs on this CPU against EAGLE-3's best setting, and so what acceptance a block drafter
needs to beat it: issue 47's "DFlash >= 1.25x the tokens/s of EAGLE-3's best setting", answered from measured
parts rather than from one draft's luck.

One process, interleaved prompt by prompt (serve/bench.py run_bench): vanilla, the released EAGLE-3 draft as a
chain (k = --chain-k) and as a tree (S/K/N), and a DFlash draft of each block size B in --block-sizes. The DFlash
drafts are random (their cost per round does not depend on what they accept: one draft pass over B slots, one
target verify of B tokens) unless --dflash-draft gives a trained one for its own B. From each row:

    round_ms(B)   = draft_ms_per_round + verify_ms_per_round          (the DFlash rows)
    eagle_best    = the faster EAGLE-3 row's tokens/s
    tau_needed(B) = goal * eagle_best * round_ms(B) / 1000            (tokens a round must yield to beat it)

and, where a trained draft is given, its measured tau and per-position acceptance beside what it needs.

    python -m benchmarks.dflash.block_cost --block-sizes 4,8,16 --limit 4 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.results_dir import run_dir


def random_dflash(target: Any, block_size: int, dtype: Any) -> Any:
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import default_dflash_contract

    contract = default_dflash_contract(target, block_size)
    return build_dflash_draft(target, contract, num_layers=1).to(dtype).eval()


def rows_for(result: dict[str, Any], goal: float, eagle_best: float, block_size: int, trained: bool) -> dict[str, Any]:
    m = result["methods"]["dflash"]
    round_ms = m["draft_ms_per_round"] + m["verify_ms_per_round"]
    return {
        "block_size": block_size,
        "drafts_per_round": block_size - 1,
        "trained": trained,
        "draft_ms_per_round": m["draft_ms_per_round"],
        "verify_ms_per_round": m["verify_ms_per_round"],
        "round_ms": round_ms,
        "tau_needed": goal * eagle_best * round_ms / 1000,
        "tau": m["tau"],
        "per_position": m["per_position"],
        "tok_s": m["median_tok_s"],
        "max_tau": float(block_size),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-sizes", default="4,8,16")
    ap.add_argument("--dflash-draft", type=Path, default=None, help="a trained DFlash draft (its own B is measured)")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--chain-k", type=int, default=3)
    ap.add_argument("--goal", type=float, default=1.25)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    from eaglewire import api as ew
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.hw import describe_cpu
    from eaglewire.serve import bench as B

    target = ew.load_target()
    draft = ew.load_draft(target=target)
    prompts = B.bench_prompts(target, "mtbench", a.limit)
    chain, tree = TreeShape.chain(a.chain_k), TreeShape(num_steps=2, topk=2, num_draft_tokens=3)
    trained = ew.load_draft(a.dflash_draft, target, dtype=draft.fc.weight.dtype) if a.dflash_draft else None
    sizes = [int(s) for s in a.block_sizes.split(",")]
    blocks = [(b, random_dflash(target, b, draft.fc.weight.dtype), False) for b in sizes]
    if trained is not None:
        blocks.append((trained.block.block_size, trained, True))
    results, eagle = [], None
    for i, (b, block_draft, is_trained) in enumerate(blocks):
        methods = ["vanilla", "dflash"] + (["eagle_chain", "eagle_tree"] if i == 0 else [])
        r = B.run_bench(
            target, draft, prompts, a.max_new_tokens, chain, tree, methods=methods, block_draft=block_draft, log=print
        )
        if eagle is None:
            eagle = {k: r["methods"][k] for k in ("vanilla", "eagle_chain", "eagle_tree")}
        results.append((b, is_trained, r))
    best = max(eagle["eagle_chain"]["median_tok_s"], eagle["eagle_tree"]["median_tok_s"])
    rows = [rows_for(r, a.goal, best, b, t) for b, t, r in results]
    out = a.out or run_dir("dflash", "fp32", "block-cost")
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "goal": a.goal,
        "eagle_best_tok_s": best,
        "eagle": eagle,
        "rows": rows,
        "prompts": a.limit,
        "max_new_tokens": a.max_new_tokens,
        "chain_k": a.chain_k,
        "cpu": describe_cpu(),
    }
    (out / "block_cost.json").write_text(json.dumps(summary, indent=1))
    lines = [
        "| B | drafts/round | draft ms/round | verify ms/round | round ms | tau needed | tau measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['block_size']}{' (trained)' if r['trained'] else ''} | {r['drafts_per_round']} | "
            f"{r['draft_ms_per_round']:.1f} | {r['verify_ms_per_round']:.1f} | {r['round_ms']:.1f} | "
            f"{r['tau_needed']:.2f} | {r['tau']:.2f} |"
        )
    text = (
        f"EAGLE-3 best: {best:.2f} tok/s (chain k={a.chain_k} tau {eagle['eagle_chain']['tau']:.2f}, tree tau "
        f"{eagle['eagle_tree']['tau']:.2f}); vanilla {eagle['vanilla']['median_tok_s']:.2f} tok/s; goal "
        f"{a.goal}x EAGLE-3's best.\n\n" + "\n".join(lines) + "\n"
    )
    (out / "block_cost.md").write_text(text)
    print(text, f"-> {out}")


if __name__ == "__main__":
    main()
