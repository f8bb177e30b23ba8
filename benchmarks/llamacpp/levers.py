"""What our EAGLE-3 draft buys in llama.cpp, lever by lever: the embedded target at Q4_1 (the file its package
ships) and f32, alone and with the released draft as our own GGUF export at several precisions and chain lengths.

    python -m benchmarks.llamacpp.levers --out benchmarks/results/llamacpp/<date>-<cpu>/

MT-bench first turns spread over the categories, greedy, the same token ids for every arm; one llama-server at a
time (arms in turn, never side by side: llama.cpp's threads spin while they wait, so a neighbour collapses its
speed). tok/s is llama-server's own decode speed (timings.predicted_ms, prefill excluded) summed over the prompts;
tau from its speculative counters; "lossless" compares each arm's tokens with the same target's plain arm.
Run it on a quiet machine; state the CPU with the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path
from typing import Any


def _arm(
    model: Path, draft: Path | None, k: int, prompts: list[list[int]], max_new: int, threads: int
) -> dict[str, Any]:
    from eaglewire.serve.llamacpp import LlamaServer

    with LlamaServer(model, draft, n_max=k, threads=threads) as srv:
        srv.complete(prompts[0], 16)  # warm-up, not counted
        before = srv.counters() if draft is not None else None
        out = [srv.complete(p, max_new) for p in prompts]
        after = srv.counters() if draft is not None else None
    tokens = sum(len(c.tokens) for c in out)
    row: dict[str, Any] = {
        "tok_s": round(tokens / (sum(c.predicted_ms for c in out) / 1000), 2),
        "tokens": tokens,
        "ids": [c.tokens for c in out],
    }
    if before is not None and after is not None:
        drafted = sum(c.draft_n for c in out)
        accepted = sum(c.draft_n_accepted for c in out)
        rounds = after.drafts - before.drafts
        row.update(
            k=k,
            drafted=drafted,
            accepted=accepted,
            rounds=rounds,
            tau=round(1 + accepted / rounds, 3) if rounds else None,
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=8, help="MT-bench questions, spread over the categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default="q4_1,f32")
    ap.add_argument("--drafts", default="f32,f16,q8_0")
    ap.add_argument("--ks", default="1,2,3")
    a = ap.parse_args()

    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.hw import describe_cpu
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.serve.llamacpp import llama_server_path, target_gguf
    from eaglewire.target.loader import load_target

    target = load_target()
    draft = load_checkpoint(resolve_draft(None), target=target)
    prompts = [p[0].tolist() for p in bench_prompts(target, "mtbench", a.limit)]
    result: dict[str, Any] = {
        "cpu": describe_cpu(),
        "machine": platform.machine(),
        "llama_server": str(llama_server_path()),
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "threads": a.threads,
        "draft_contract": draft.contract.fingerprint(),
        "arms": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for tprec in a.targets.split(","):
            model = target_gguf(tprec)
            plain = _arm(model, None, 0, prompts, a.max_new_tokens, a.threads)
            result["arms"][f"{tprec}/alone"] = plain
            print(f"{tprec} alone: {plain['tok_s']} tok/s", flush=True)
            for dprec in a.drafts.split(","):
                gguf = (
                    export_draft(
                        draft,
                        draft.contract,
                        Path(tmp) / f"{tprec}-{dprec}",
                        "llamacpp",
                        gguf_dtype=dprec,
                        vocab_from=model,
                    )
                    / "draft.gguf"
                )
                for k in (int(x) for x in a.ks.split(",")):
                    row = _arm(model, gguf, k, prompts, a.max_new_tokens, a.threads)
                    row["lossless"] = row["ids"] == plain["ids"]
                    row["speedup"] = round(row["tok_s"] / plain["tok_s"], 3)
                    result["arms"][f"{tprec}/draft-{dprec}/k{k}"] = row
                    print(
                        f"{tprec} + draft {dprec} k={k}: {row['tok_s']} tok/s ({row['speedup']}x), tau "
                        f"{row['tau']}, lossless {row['lossless']}",
                        flush=True,
                    )
    for row in result["arms"].values():
        row.pop("ids")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "levers.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
