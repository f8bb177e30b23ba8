"""Throughput of the training pipeline on the embedded target (2 cores, fp32): regeneration tokens/s at
batch 1 vs batched, capture tokens/s, and TTT training tokens/s. Rounds are interleaved; medians.

    python -m benchmarks.training.bench_training --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eaglewire.contract import default_taps
from eaglewire.data.conversations import read_conversations
from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.regenerate import GenerationSettings, LocalGenerator
from eaglewire.data.samples import tokenize_conversations
from eaglewire import load_target
from eaglewire.train.loop import TrainConfig, build_draft
from eaglewire.train.ttt import TTTModel
from eaglewire.draft.vocab import build_vocab_map, count_masked_tokens
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/


def regen_rate(target, prompts, batch: int, new_tokens: int) -> float:
    gen = LocalGenerator(target, GenerationSettings(max_new_tokens=new_tokens, batch_size=batch))
    t0, n = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        n += sum(r.new_tokens for r in gen.generate(prompts[i : i + batch], seed=0))
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=run_dir("training") / "training.json")
    ap.add_argument("--skip-regen", action="store_true", help="Only capture and training throughput.")
    a = ap.parse_args()
    torch.set_num_threads(2)
    target = load_target()
    convs = [c for _, c in zip(range(64), read_conversations("sharegpt"))]
    prompts = [[{"role": "user", "content": c.user_turns[0][:400]}] for c in convs[:16]]
    # Training-shaped samples from real ShareGPT answers (only throughput is measured here).
    samples = tokenize_conversations(target.tokenizer, convs, max_length=512)
    vmap = build_vocab_map(count_masked_tokens(samples, target.vocab_size), 16000)
    contract = target.contract(default_taps(target.num_layers), vocab_map=vmap)
    feats = OnlineFeatures(target, contract, pad_id=target.tokenizer.eos_token_id)
    c = TrainConfig(ttt_steps=7)
    model = TTTModel(
        build_draft(target, contract, vmap, c),
        target.model.get_output_embeddings().weight.detach(),
        steps=c.ttt_steps,
        decay=c.ttt_decay,
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    results: dict[str, list[float]] = {"regen_b1": [], "regen_b8": [], "regen_b16": [], "capture": [], "train_ttt7": []}
    if a.skip_regen:
        for k in ("regen_b1", "regen_b8", "regen_b16"):
            results.pop(k)
    for r in range(a.rounds):
        if not a.skip_regen:
            results["regen_b1"].append(regen_rate(target, prompts[:4], 1, a.new_tokens))
            results["regen_b8"].append(regen_rate(target, prompts[:8], 8, a.new_tokens))
            results["regen_b16"].append(regen_rate(target, prompts[:16], 16, a.new_tokens))
        batch = samples[4 * r : 4 * r + 4]
        t0 = time.perf_counter()
        fb = feats.batch(batch)
        results["capture"].append(int(fb.attention_mask.sum()) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        loss, _ = model(fb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        results["train_ttt7"].append(int(fb.attention_mask.sum()) / (time.perf_counter() - t0))
        print({k: round(v[-1], 1) for k, v in results.items()}, flush=True)
    summary = {k: {"median_tok_s": statistics.median(v), "runs": v} for k, v in results.items()}
    summary["setup"] = {
        "rounds": a.rounds,
        "new_tokens": a.new_tokens,
        "threads": 2,
        "dtype": "float32",
        "train": "draft fwd+bwd+AdamW, TTT 7, V_d 16000, features captured separately",
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: round(v["median_tok_s"], 1) for k, v in summary.items() if k != "setup"}))


if __name__ == "__main__":
    main()
