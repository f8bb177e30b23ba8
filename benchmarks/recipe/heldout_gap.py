"""Offline acceptance of a draft: teacher-forced top-1 agreement per TTT position and greedy k-chain tau,
anchored at every position and walked round by round as a decoder walks it, on three sample sets (--sets):
- sharegpt_heldout: the training data's held-out split (regenerated answers, never trained on);
- mtbench_answers: the target's own regenerated answers to MT-bench (an evaluation set: used here to
  evaluate only);
- mtbench_bench_sample: the questions `eaglewire bench --limit N` asks, with the answers its vanilla row
  decodes: round by round this reproduces the bench's online tau (2026-12-02: 1.989 against 1.995, 16 x
  256) in a minute or two instead of a bench run.
Each set also reports first-position agreement by the target's own confidence (`buckets`: the target's top-1
probability at the token the first draft must guess, bins as in `round_starts.py`): whether a gap between two
sets is the draft doing worse at equal target confidence, or the text being harder for the target itself.
The plain figures (top-1 per position, chain tau) of one draft on one split are `eaglewire eval`; this adds
the sets, dtypes, confidence buckets and per-category splits beside one another.
fp32 vs bf16 target (--dtypes) separates a dtype mismatch (training features were captured with a bf16
target, serving runs fp32) from a distribution gap (the same fp32 target on both sets).

    python -m benchmarks.recipe.heldout_gap --draft src/eaglewire/assets/drafts/smollm2-135m --samples 48
    python -m benchmarks.recipe.heldout_gap --draft RUN/draft --samples 16 --dtypes fp32 --sets mtbench_bench_sample
    python -m benchmarks.recipe.heldout_gap --samples 40 --dtypes fp32 --sets mtbench_bench_sample --by-category
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.samples import load_samples, split_heldout
from eaglewire.hw import describe_cpu
from eaglewire import load_target
from eaglewire.train.ttt import TTTModel, shift_left
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # --dtypes names of the target's dtype
BUCKETS = (0.0, 0.3, 0.5, 0.8, 1.01)  # the target's top-1 probability: [lo, hi), as round_starts.py bins it
SETS = ("sharegpt_heldout", "mtbench_answers", "mtbench_bench_sample")  # --sets, described in the docstring


@torch.no_grad()
def agreement(draft, target, samples, steps: int, batch: int = 4) -> dict:
    """Teacher-forced top-1 agreement per position over answer tokens (what `eaglewire train` reports), and
    first-position agreement by the target's confidence (`bucket_counts`), from one target pass per batch."""
    feats = OnlineFeatures(target, draft.contract, pad_id=target.pad_id)
    head = target.model.get_output_embeddings().weight.detach().float()  # [V, H_t]
    model = TTTModel(draft, head, steps=steps, decay=0.8).eval()
    correct, counts, chain, anchors, tokens, rounds = [0] * steps, [0] * steps, [0] * steps, 0, 0, 0
    bins = torch.zeros(3, len(BUCKETS) - 1)  # positions, first-position hits, outside V_d; per bin
    for i in range(0, len(samples), batch):
        fb = feats.batch(samples[i : i + batch])
        fb.taps, fb.final_hidden = fb.taps.float(), fb.final_hidden.float()
        _, st = model(fb)
        bins += bucket_counts(draft, fb, head)
        correct = [a + b for a, b in zip(correct, st.correct)]
        counts = [a + b for a, b in zip(counts, st.counts)]
        chain, anchors = [a + b for a, b in zip(chain, st.chain)], anchors + st.anchors
        tokens, rounds = tokens + st.round_tokens, rounds + st.rounds
    # chain: the share of anchors (every answer position with k answer tokens after it) whose steps 1..i were
    # all right, out-of-vocab a miss: greedy k-chain acceptance anchored at every position, where a real run
    # anchors only where rounds start
    pos, hit, oov = bins
    return {
        "acc": [round(c / n, 4) for c, n in zip(correct, counts)],
        "positions": counts,
        "chain": [round(c / anchors, 4) for c in chain],
        "tau_chain": round(1 + sum(chain) / anchors, 3),
        "tau_rounds": round(tokens / rounds, 3),
        "rounds": rounds,
        "buckets": [
            {
                "target_p1": [lo, hi],
                "share": round(float(c / pos.sum()), 4),
                "first_agree": round(float(h / max(c, 1)), 4),
                "out_of_vocab": round(float(o / max(c, 1)), 4),
            }
            for lo, hi, c, h, o in zip(BUCKETS, BUCKETS[1:], pos, hit, oov)
        ],
    }


def bucket_counts(draft, fb, head: torch.Tensor) -> torch.Tensor:
    """[3, bins]: answer positions, first-position hits and tokens outside V_d, binned by the target's own
    top-1 probability. Position t drafts x_{t+2} from the taps at t and x_{t+1}; the target's distribution
    over x_{t+2} is its head on the final state at t + 1. A token outside the draft vocab is a miss, as a
    decoder counts it."""
    out = draft.step(shift_left(fb.input_ids, 1), draft.fuse(fb.taps))  # causal; logits [B, T, V_d]
    guess = draft.to_target_ids(out.logits.argmax(-1))  # [B, T] target ids
    p1, top1 = (shift_left(x, 1) for x in torch.softmax(fb.final_hidden @ head.T, -1).max(-1))  # [B, T]: x_{t+2}
    rows = shift_left(fb.loss_mask, 2) > 0  # x_{t+2} is an answer token
    b = torch.bucketize(p1[rows], torch.tensor(BUCKETS[1:-1]), right=True)  # [N] bin index
    k = len(BUCKETS) - 1
    return torch.stack(
        [
            torch.bincount(b, minlength=k).float(),
            torch.bincount(b, weights=(guess[rows] == top1[rows]).float(), minlength=k),
            torch.bincount(b, weights=(~draft.t2d[top1[rows]]).float(), minlength=k),
        ]
    )


def bench_sample(target, limit: int, max_new_tokens: int = 256) -> list:
    """The questions `eaglewire bench --limit N` asks (first turns, spread over the categories) with the
    answers its vanilla row decodes (greedy, this target and dtype, the plain runtime): the very text whose
    online tau the bench measures, so the offline figures compare with it directly."""
    from eaglewire.data.conversations import Conversation, Turn
    from eaglewire.data.samples import tokenize_conversations
    from eaglewire.serve.bench import spread_over_categories
    from eaglewire.decoding.engine import greedy_reference
    from eaglewire.decoding.runtime import plain_runtime

    tok = target.tokenizer
    asked = spread_over_categories("mtbench", limit)
    rt = plain_runtime(target, 1024 + max_new_tokens)
    convs = []
    for q in asked:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q.user_turns[0]}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )["input_ids"]
        answer = greedy_reference(rt, ids, max_new_tokens, eos={tok.eos_token_id})
        text = tok.decode(answer, skip_special_tokens=True)
        convs.append(Conversation(q.id, (Turn("user", q.user_turns[0]), Turn("assistant", text))))
    return tokenize_conversations(tok, convs, max_length=1024 + max_new_tokens)


def by_category(sets: dict[str, list]) -> dict[str, list]:
    """The MT-bench sets split by question category ("SET:CATEGORY"); a sample's id is "QUESTION_ID#turn"."""
    from eaglewire.serve.bench import question_categories

    cats, split = question_categories("mtbench"), {}
    for name, samples in sets.items():
        for s in samples if name.startswith("mtbench") else []:
            split.setdefault(f"{name}:{cats.get(s.id.split('#')[0], 'uncategorised')}", []).append(s)
    return split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--draft",
        type=Path,
        nargs="+",
        default=[Path("src/eaglewire/assets/drafts/smollm2-135m")],
        help="one or more drafts, scored on the same samples (decoded once)",
    )
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=run_dir("recipe") / "heldout_gap.json")
    ap.add_argument("--dtypes", default="fp32,bf16", help="target dtypes to compare, from: " + ", ".join(DTYPES))
    ap.add_argument("--sets", default=",".join(SETS), help="sample sets, from: " + ", ".join(SETS))
    ap.add_argument(
        "--by-category",
        action="store_true",
        help="also score each MT-bench set per question category (sets named SET:CATEGORY)",
    )
    a = ap.parse_args()
    unknown = [n for n in a.dtypes.split(",") if n not in DTYPES] + [n for n in a.sets.split(",") if n not in SETS]
    if unknown:
        ap.error(f"--dtypes / --sets: unknown {unknown}; expected names from {list(DTYPES)} / {list(SETS)}")
    targets = {n: load_target(dtype=DTYPES[n]) for n in a.dtypes.split(",")}
    reference = load_target() if "fp32" not in targets else targets["fp32"]  # the draft loads against fp32
    tok = reference.tokenizer
    share = (
        load_samples("smollm2-regen+smollm2-regen-vllm", tok, max_length=1024)[0]
        if "sharegpt_heldout" in a.sets
        else []
    )
    build = {
        "sharegpt_heldout": lambda: split_heldout(share, 0.05)[1][: a.samples],
        "mtbench_answers": lambda: load_samples("smollm2-mtbench-regen", tok, max_length=1024)[0][: a.samples],
        "mtbench_bench_sample": lambda: bench_sample(reference, a.samples),
    }
    sets = {name: build[name]() for name in a.sets.split(",")}
    if a.by_category:
        sets.update(by_category(sets))
    out = {"cpu": describe_cpu(), "drafts": [str(d) for d in a.draft], "results": {}}
    for dpath in a.draft:
        for tname, target in targets.items():
            draft = load_checkpoint(dpath, target=reference).float()
            for sname, samples in sets.items():
                r = agreement(draft, target, samples, a.steps)
                out["results"][f"{dpath}/{sname}/{tname}" if len(a.draft) > 1 else f"{sname}/{tname}"] = r
                print(
                    f"{dpath} {sname} target {tname}: top-1 per position {r['acc']} over {r['positions'][0]} "
                    f"tokens; chain {r['chain']}, tau {r['tau_chain']} at every position, {r['tau_rounds']} "
                    "round by round",
                    flush=True,
                )
                for bk in r["buckets"]:
                    print(
                        f"  target p1 {bk['target_p1']}: share {bk['share']}, first-position agreement "
                        f"{bk['first_agree']}, outside V_d {bk['out_of_vocab']}",
                        flush=True,
                    )
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps(out, indent=2) + "\n")  # after each case: a cut-short run keeps its part


if __name__ == "__main__":
    main()
