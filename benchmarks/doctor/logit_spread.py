"""How far the target's logits move when the same tokens go through other GEMM shapes (a batched prefill
against one-row cached decoding, as a server's verify rounds against our reference's) in each dtype, and
between the fp32 and bf16 target: the spread `doctor live` reads a near-tie against (doctor/live_lossless.py
TIE_LOGITS). Greedy answers to a few MT-bench-style prompts, every position's logits compared.

    python -m benchmarks.doctor.logit_spread --out benchmarks/results/live_probe/DATE-CPU
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

PROMPTS = (
    "Give me three tips for staying healthy.",
    "Write a short poem about the sea.",
    "Explain photosynthesis to a child.",
    "Compose a travel blog post about a trip to Hawaii.",
)


def _one_row(model, full: torch.Tensor, n: int) -> torch.Tensor:
    """Logits [T-n, V] of positions n-1 .. T-2, prefill of n tokens then one cached row at a time."""
    out = model(full[:, :n], use_cache=True)
    cache, rows = out.past_key_values, [out.logits[0, -1]]
    for j in range(n, full.shape[1] - 1):
        out = model(full[:, j : j + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1])
    return torch.stack(rows).float()


def main() -> None:
    from eaglewire.target.loader import load_target

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t32, t16 = load_target(), load_target(dtype=torch.bfloat16)
    spread = {"float32_shapes": 0.0, "bfloat16_shapes": 0.0, "float32_vs_bfloat16": 0.0}
    with torch.no_grad():
        for q in PROMPTS:
            ids = t32.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            n = ids.shape[1]
            full = t32.model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
            a32 = t32.model(full).logits[0, n - 1 : -1].float()
            a16 = t16.model(full).logits[0, n - 1 : -1].float()
            spread["float32_shapes"] = max(
                spread["float32_shapes"], (a32 - _one_row(t32.model, full, n)).abs().max().item()
            )
            spread["bfloat16_shapes"] = max(
                spread["bfloat16_shapes"], (a16 - _one_row(t16.model, full, n)).abs().max().item()
            )
            spread["float32_vs_bfloat16"] = max(spread["float32_vs_bfloat16"], (a32 - a16).abs().max().item())
    args.out.mkdir(parents=True, exist_ok=True)
    rec = {
        "max_abs_logit_difference": spread,
        "prompts": len(PROMPTS),
        "new_tokens": args.new_tokens,
        "target": t32.name,
        "torch": torch.__version__,
        "command": f"python -m benchmarks.doctor.logit_spread --out {args.out}",
    }
    (args.out / "logit_spread.json").write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
