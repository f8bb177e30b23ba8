"""A smaller draft head for the llama.cpp parts benchmark: keep the N most frequent rows of the released draft's
reduced head (its other weights untouched), with d2t / t2d and the contract's vocabulary fields made to agree.

Frequencies are counted on the draft's own training conversations (the data its vocabulary was built from, never
a benchmark set): trained (loss-masked) tokens, restricted to the ids the draft vocabulary already holds. Rows of
the kept ids keep their order (ascending target id), so the smaller map is a valid VocabMap and its GGUF d2t the
absolute ids llama.cpp scatters logits to. No retraining: what a head of N rows buys in time and loses in tau.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

# the released draft's vocabulary source (its summary.json: `eaglewire vocab build --data ... --limit 2817`)
TRAIN_DATA = "smollm2-regen+smollm2-regen-vllm"
TRAIN_LIMIT = 2817


def draft_token_counts(
    target: Any, draft: Any, data: str = TRAIN_DATA, limit: int = TRAIN_LIMIT, max_length: int = 2048
) -> tuple[torch.Tensor, int]:
    """(int64 [V_d]: how often each draft-vocabulary row's target id is a trained token of `data`, the number of
    trained tokens in all)."""
    from eaglewire.data.samples import load_samples
    from eaglewire.draft.vocab import count_masked_tokens

    samples, _ = load_samples(data, target.tokenizer, max_length=max_length, limit=limit)
    counts = count_masked_tokens(samples, target.vocab_size)  # [V]
    ids = torch.arange(draft.d2t.numel()) + draft.d2t  # [V_d] target id of each head row
    return counts[ids], int(counts.sum())


def shrink_head(draft: Any, contract: Any, counts: torch.Tensor, n: int) -> tuple[Any, Any]:
    """(draft, contract) with the head cut to the `n` most frequent rows (ties: lower row). Refuses n larger
    than the draft's own head: rows it never had cannot be made up."""
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.draft.vocab import VocabMap
    from eaglewire.errors import EaglewireError

    v_d = draft.cfg.draft_vocab_size
    if not 0 < n <= v_d or tuple(counts.shape) != (v_d,):
        raise EaglewireError(
            f"cannot cut the draft's head to {n} rows",
            expected=f"1 .. {v_d} rows (the head it has) and one count per row [{v_d}]",
            found=f"{n} rows, counts {tuple(counts.shape)}",
            fix="a head larger than the trained one needs training, not a cut",
        )
    order = torch.argsort(-counts, stable=True)  # most frequent first; stable: ties by lower row
    rows = torch.sort(order[:n]).values  # [n] kept rows, ascending (= ascending target id)
    target_ids = torch.arange(v_d)[rows] + draft.d2t[rows]
    vmap = VocabMap.from_target_ids(target_ids, draft.cfg.vocab_size)
    small = Eagle3Draft(dataclasses.replace(draft.cfg, draft_vocab_size=n))
    state = dict(draft.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"][rows].clone()  # [n, H]
    state["d2t"], state["t2d"] = vmap.d2t, vmap.t2d
    small.load_state_dict(state, strict=True)
    small.embedding_attached = draft.embedding_attached
    small_contract = dataclasses.replace(contract, draft_vocab_size=n, vocab_map_sha256=vmap.sha256())
    small.cfg.require_matches(small_contract)
    small.contract = small_contract
    return small, small_contract


def coverage(counts: torch.Tensor, total: int, n: int) -> float:
    """Share of the training data's trained tokens the top-n head rows hold."""
    top = torch.sort(counts, descending=True, stable=True).values[:n]
    return float(top.sum()) / max(1, total)
