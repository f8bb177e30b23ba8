"""Drafting cost per chain round: the released draft proposing through its own nn.Linears ("module") and
through the accelerated GEMM layouts ("auto", fastcpu/draft.py), side by side in one process.

One round = accept T target taps (T = 1..4, cycling, as rounds accept 0..3 drafted tokens plus the bonus)
and propose a chain of k = 3 (the accepted run's forward plus k - 1 draft steps). The two proposers run
alternately on the same random taps, each round after a CacheFlush (decoding drafts after the target's
forward has evicted the draft's weights); medians over the rounds after a warm-up, per draft dtype.
With several --drafts (a wider vocabulary's head, say) each runs through the lean layouts, interleaved.

    python -m benchmarks.decoding.bench_draft --rounds 80
    python -m benchmarks.decoding.bench_draft --rounds 80 --drafts RELEASE GROWN_32K
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.fastcpu.draft import FastDraft
from eaglewire.fastcpu.gemm import CacheFlush
from eaglewire.decoding.propose import EagleProposer
from eaglewire.decoding.tree import TreeShape
from eaglewire.hw import describe_cpu, native_bf16
from eaglewire import load_target

DRAFT = "src/eaglewire/assets/drafts/smollm2-135m"
PROMPT, MAX_LEN, WARMUP = 100, 600, 20  # tokens committed before timing; cache room; rounds not counted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument(
        "--drafts",
        nargs="+",
        default=[DRAFT],
        help="one draft: module vs lean layouts; several: each through the lean layouts",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    target = load_target(None)
    width = len(target.contract((2, 15, 27)).taps) * target.hidden_size  # [.., 3*H] taps per position
    dtypes = (torch.float32, torch.bfloat16) if native_bf16() else (torch.float32,)
    for dtype in dtypes:
        layouts = ("module", "auto") if len(args.drafts) == 1 else ("auto",)
        props = {}
        for i, path in enumerate(args.drafts):
            draft = load_checkpoint(path, target=target, dtype=dtype)
            for lay in layouts:
                name = lay if len(args.drafts) == 1 else f"draft {i} (V_d {draft.cfg.draft_vocab_size})"
                props[name] = EagleProposer(
                    draft, TreeShape.chain(args.k), MAX_LEN, None if lay == "module" else FastDraft(draft, lay)
                )
        for p in props.values():
            p.start(torch.randint(0, 40000, (1, PROMPT)), torch.randn(1, PROMPT, width, dtype=dtype), 5)
        ms: dict[str, list[float]] = {k: [] for k in props}
        flush = CacheFlush()
        for i in range(WARMUP + args.rounds):
            T = 1 + i % 4
            taps = torch.randn(1, T, width, dtype=dtype)  # [1, T, 3*H]
            for name, p in props.items():
                if p.n > MAX_LEN - 100:  # rewind: keeps the attended cache between PROMPT and MAX_LEN - 100
                    p.n = PROMPT + 1
                flush()
                t0 = time.perf_counter()
                p.accept(taps, list(range(100, 100 + T)))
                p.propose()
                ms[name].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v[WARMUP:]) for k, v in ms.items()}
        first = next(iter(med.values()))
        ratio = (
            f" ({med['module'] / med['auto']:.2f}x)"
            if "module" in med
            else " (" + ", ".join(f"{v / first:.2f}x" for v in med.values()) + " of the first)"
        )
        print(
            f"{str(dtype).removeprefix('torch.')}: ms per chain-{args.k} drafting round, median of {args.rounds}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
            + ratio
        )
        if len(args.drafts) > 1:
            print("  drafts: " + ", ".join(f"{i}: {d}" for i, d in enumerate(args.drafts)))
    print(f"CPU: {describe_cpu()}")


if __name__ == "__main__":
    main()
