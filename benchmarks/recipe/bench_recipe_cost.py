"""What one training step costs under each recipe lever, side by side in one process (rounds interleaved,
medians, the CPU stated): the price half of "accuracy per CPU second" (benchmarks/recipe/recipe_ablation.py gives
the accuracy half at equal steps). Real captured batches, bf16 autocast where the CPU has native bf16.

    python -m benchmarks.recipe.bench_recipe_cost FEATURES VOCAB --vocab16k VOCAB16K
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from eaglewire.capture.features import OfflineFeatures, captured_taps
from eaglewire.hw import autocast_dtype, describe_cpu
from eaglewire import load_target
from eaglewire.train.loop import TrainConfig, build_draft
from eaglewire.train.ttt import TTTModel
from eaglewire.draft.vocab import load_vocab
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

# lever -> (TrainConfig fields, which vocab); levers absent here (init, lr, data source) cost what base costs
CASES = {
    "base": ({}, "8k"),
    "supervise_all": ({"supervise": "all"}, "8k"),
    "vocab16k": ({}, "16k"),
    "layers2": ({"num_layers": 2}, "8k"),
    "ttt1": ({"ttt_steps": 1}, "8k"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("features", type=Path)
    ap.add_argument("vocab", type=Path)
    ap.add_argument("--vocab16k", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=run_dir("recipe") / "cost.json")
    a = ap.parse_args()
    target = load_target()
    vmaps = {"8k": load_vocab(a.vocab)[0], "16k": load_vocab(a.vocab16k)[0]}
    taps = captured_taps(a.features)  # the boundaries the features hold, from their manifest
    contract = target.contract(taps, vocab_map=vmaps["8k"])
    feats = OfflineFeatures(a.features, contract, pad_id=target.tokenizer.eos_token_id)
    batches = [feats.batch(feats.samples()[i : i + a.batch]) for i in range(0, 4 * a.batch, a.batch)]
    tokens = [int(b.attention_mask.sum()) for b in batches]
    low = autocast_dtype("cpu", "auto")
    head = target.model.get_output_embeddings().weight.detach()

    def make(fields: dict, vocab: str):
        c = TrainConfig(**{"ttt_steps": 3, **fields})
        contract = target.contract(taps, vocab_map=vmaps[vocab])
        model = TTTModel(build_draft(target, contract, vmaps[vocab], c), head, steps=c.ttt_steps, decay=0.8)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

        def step(fb) -> None:
            with torch.autocast("cpu", dtype=low) if low is not None else nullcontext():
                loss, _ = model(fb, all_positions=c.supervise == "all")
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    steps = {k: make(*v) for k, v in CASES.items()}
    for fn in steps.values():
        fn(batches[0])  # warm-up
    res: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(a.rounds):
        order = list(steps)[r % len(steps) :] + list(steps)[: r % len(steps)]
        for k in order:
            t0 = time.perf_counter()
            for b in batches:
                steps[k](b)
            res[k].append(sum(tokens) / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {
        "cpu": describe_cpu(),
        "batch": a.batch,
        "tokens_per_round": sum(tokens),
        "autocast": str(low),
        "tok_per_s_median": med,
        "cost_vs_base": {k: med["base"] / v for k, v in med.items()},
        "tok_per_s": res,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    for k, v in med.items():
        print(f"{k:16s} {v:7.0f} tok/s  {med['base'] / v:5.2f}x the base step's cost")


if __name__ == "__main__":
    main()
