"""What the first drafted token of a round is up against: the anatomy of first-position acceptance,
measured on the real decoder (`SpecDecoder`, chain k) over the questions `eaglewire bench --limit N` asks.

For every round it records the draft's level-1 logits (the first drafted token), then scores the whole
decoded text with one target forward and asks, for the token that first draft had to guess:
- how sure the target itself was of it (its top-1 probability there, the target's own greedy margin);
- whether the draft vocabulary holds it at all;
- where it ranked among the draft's candidates (top-1 is what a chain accepts; top-2/top-4 what a tree
  with that branching could have verified).
The same target-confidence histogram over every answer position shows whether round starts (mostly right
after a rejection) are where the target itself is less sure. Self-check: the recorded level-1
argmax reproduces the decoder's own acceptance of the first draft, round by round.

    python -m benchmarks.recipe.round_starts --limit 16 --max-new-tokens 256 --k 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
from eaglewire.serve.bench import spread_over_categories
from eaglewire.decoding.engine import SpecDecoder
from eaglewire import compose
from eaglewire.decoding.tree import TreeShape
from eaglewire.hw import describe_cpu
from eaglewire import load_target
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

BUCKETS = (0.0, 0.3, 0.5, 0.8, 1.01)  # target top-1 probability bins: [lo, hi)


class Recording:
    """An EagleProposer that keeps each round's level-1 draft logits [V_d] (what its first token is read from)."""

    def __init__(self, inner: Any) -> None:  # an EagleProposer
        self.inner, self.taps, self.level1 = inner, inner.taps, []

    def start(self, prompt_ids, prompt_taps, first_token) -> None:
        self.inner.start(prompt_ids, prompt_taps, first_token)

    def propose(self):
        self.level1.append(self.inner.d.lm_head(self.inner.last_normed)[0, -1].float().clone())
        return self.inner.propose()

    def accept(self, taps, tokens) -> None:
        self.inner.accept(taps, tokens)


@torch.no_grad()
def rounds_of(
    rt, decoder: SpecDecoder, rec: Recording, draft, ids: torch.Tensor, n: int, eos: int
) -> tuple[list[dict], list[float]]:
    """Decode one prompt; return a record per round (target p1, in vocab, draft rank, accepted) and the
    target's top-1 probability at every answer position."""
    rec.level1.clear()
    out, st = decoder.generate(ids, n, eos={eos})
    P = ids.shape[1]
    seq = torch.cat([ids, torch.tensor([out[:-1]])], dim=1)  # [1, P + len(out) - 1]: row P-1+s predicts out[s]
    logits, _ = rt.forward(seq, torch.arange(seq.shape[1])[None], 0)
    probs = logits[0, P - 1 :].float().softmax(-1)  # [len(out), V]: row s is the target's distribution of out[s]
    p1_all = probs.max(-1).values.tolist()
    records, s = [], 1  # round i's first draft guesses out[s_i]; s_0 = 1 (out[0] is the prefill's token)
    for level1, acc in zip(rec.level1, st.accepted):
        if s >= len(out):
            break
        y = out[s]
        in_vocab = bool(draft.t2d[y])
        order = level1.argsort(descending=True)
        rank = int((draft.to_target_ids(order) == y).nonzero()[0]) + 1 if in_vocab else None
        if (rank == 1) != (acc >= 1):
            raise AssertionError(
                f"round at answer position {s}: the recorded draft rank {rank} disagrees with "
                f"the decoder's acceptance {acc}: the anatomy is misaligned"
            )
        records.append({"p1": p1_all[s], "in_vocab": in_vocab, "rank": rank, "accepted": acc})
        s += acc + 1
    return records, p1_all[1:]


def summarise(records: list[dict], p1_all: list[float]) -> dict:
    n = len(records)
    out = {
        "rounds": n,
        "first_accepted": sum(r["rank"] == 1 for r in records) / n,
        "out_of_vocab": sum(not r["in_vocab"] for r in records) / n,
        "in_draft_top2": sum(r["rank"] is not None and r["rank"] <= 2 for r in records) / n,
        "in_draft_top4": sum(r["rank"] is not None and r["rank"] <= 4 for r in records) / n,
        "buckets": [],
    }
    for lo, hi in zip(BUCKETS, BUCKETS[1:]):
        inside = [r for r in records if lo <= r["p1"] < hi]
        everywhere = sum(lo <= p < hi for p in p1_all)
        out["buckets"].append(
            {
                "target_p1": [lo, min(hi, 1.0)],
                "share_of_round_starts": len(inside) / n,
                "share_of_all_answer_positions": everywhere / len(p1_all),
                "first_accepted": sum(r["rank"] == 1 for r in inside) / len(inside) if inside else None,
                "out_of_vocab": sum(not r["in_vocab"] for r in inside) / len(inside) if inside else None,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, default=None, help="draft directory (default: the released draft)")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--out", type=Path, default=run_dir("recipe") / "round_starts.json")
    a = ap.parse_args()
    target = load_target(dtype=torch.float32)
    draft = load_checkpoint(resolve_draft(a.draft), target=target, dtype=torch.float32)
    tok = target.tokenizer
    chain = TreeShape.chain(a.k)
    max_len = compose.cache_len(1024 + a.max_new_tokens, chain)
    rt = compose.runtime(target, max_len, accelerate=False)  # tau does not depend on how fast the GEMMs run
    rec = Recording(compose.proposer(draft, chain, max_len, rt))
    decoder = SpecDecoder(rt, rec)
    records, p1_all = [], []
    for q in spread_over_categories("mtbench", a.limit):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q.user_turns[0]}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )["input_ids"]
        r, p = rounds_of(rt, decoder, rec, draft, ids, a.max_new_tokens, tok.eos_token_id)
        records += r
        p1_all += p
    result = {
        "cpu": describe_cpu(),
        "draft": str(resolve_draft(a.draft)),
        "k": a.k,
        "limit": a.limit,
        "max_new_tokens": a.max_new_tokens,
        **summarise(records, p1_all),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['rounds']} rounds: first draft accepted {result['first_accepted']:.3f}, target token outside "
        f"the draft vocab {result['out_of_vocab']:.3f}, in the draft's top-2 {result['in_draft_top2']:.3f}, "
        f"top-4 {result['in_draft_top4']:.3f}"
    )
    print(
        "| target top-1 prob | share of round starts | share of all answer positions | first accepted | out of vocab |"
    )
    print("|---|---|---|---|---|")
    for b in result["buckets"]:
        fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
        print(
            f"| {b['target_p1'][0]:.1f}–{b['target_p1'][1]:.1f} | {b['share_of_round_starts']:.3f} | "
            f"{b['share_of_all_answer_positions']:.3f} | {fmt(b['first_accepted'])} | {fmt(b['out_of_vocab'])} |"
        )


if __name__ == "__main__":
    main()
