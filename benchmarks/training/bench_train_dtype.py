"""Training throughput levers, side by side in one process on the embedded target: capture with the target
in fp32 vs bf16, and one TTT training step (fwd + bwd + AdamW) in fp32 vs bf16 autocast, with the loss'
target top-1 stored at capture (sliced V_d head) vs recomputed from the full V-wide head (the old path).
Rounds interleaved, medians, the CPU stated (bf16 is only fast where it is native: hw.native_bf16).

    python -m benchmarks.training.bench_train_dtype --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from eaglewire.contract import default_taps
from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.samples import load_samples
from eaglewire.hw import describe_cpu
from eaglewire import load_target
from eaglewire.train.loop import TrainConfig, build_draft
from eaglewire.train.ttt import TTTModel
from eaglewire.draft.vocab import build_vocab_map, count_masked_tokens
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/


def _tok_per_s(fn, tokens: int) -> float:
    t0 = time.perf_counter()
    fn()
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--draft-vocab", type=int, default=8000)
    ap.add_argument("--out", type=Path, default=run_dir("training") / "train_dtype.json")
    a = ap.parse_args()
    t32, t16 = load_target(), load_target(dtype=torch.bfloat16)
    samples, _ = load_samples("smollm2-regen", t32.tokenizer, max_length=512, limit=64)
    batch = sorted(samples, key=lambda s: len(s.input_ids))[-a.batch :]  # long ones: realistic shapes
    tokens = sum(len(s.input_ids) for s in batch)
    vmap = build_vocab_map(count_masked_tokens(samples, t32.vocab_size), a.draft_vocab)
    contract = t32.contract(default_taps(t32.num_layers), vocab_map=vmap)
    pad = t32.tokenizer.eos_token_id
    f32, f16 = OnlineFeatures(t32, contract, pad), OnlineFeatures(t16, contract, pad)
    fb = f32.batch(batch)
    head = t32.model.get_output_embeddings().weight.detach()
    stored = replace(fb, target_top1=(fb.final_hidden @ head.T).argmax(-1))
    c = TrainConfig(ttt_steps=3)
    model = TTTModel(build_draft(t32, contract, vmap, c), head, steps=3, decay=0.8)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step(features, low: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if low else nullcontext():
            loss, _ = model(features)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    cases = {
        "capture_fp32": lambda: f32.batch(batch),
        "capture_bf16": lambda: f16.batch(batch),
        "train_fp32_full_head": lambda: step(fb, False),
        "train_fp32_stored_top1": lambda: step(stored, False),
        "train_bf16_stored_top1": lambda: step(stored, True),
    }
    for fn in cases.values():
        fn()  # warm-up
    res: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(a.rounds):
        for k in list(cases)[r % len(cases) :] + list(cases)[: r % len(cases)]:
            res[k].append(_tok_per_s(cases[k], tokens))
    out = {
        "cpu": describe_cpu(),
        "batch_tokens": tokens,
        "draft_vocab": a.draft_vocab,
        "ttt_steps": 3,
        "tok_per_s_median": {k: statistics.median(v) for k, v in res.items()},
        "tok_per_s": res,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    for k, v in out["tok_per_s_median"].items():
        print(f"{k:28s} {v:8.0f} tok/s")


if __name__ == "__main__":
    main()
