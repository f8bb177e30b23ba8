"""The block proposer: a block drafter (DFlash) behind the one Proposer protocol.

    start(prompt, taps, x)   the context cache takes the prompt's taps (positions 0..P-1); x is the anchor
    propose()                one draft pass over [x, MASK x (B-1)] at positions n..n+B-1; the draft's argmax
                             at the predicting slots is a chain of k tokens (k = B-1 for DFlash's "bonus"
                             layout, B for "anchor_first"; fewer when the round is limited to k drafts)
    accept(taps, tokens)     the context grows with the taps of the anchor and the accepted drafts (the
                             positions the target has now verified); the bonus token is the next anchor

The target verifies the chain like any other (SpecDecoder), so greedy output is the target's token for token
and sampling keeps its distribution (the drafts are point-mass proposals to `sample_accept`).
"""

from __future__ import annotations

import torch

from eaglewire.contract import WiringContract
from eaglewire.decoding.tree import DraftTree, TreeShape
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.errors import EaglewireError


def block_shape(contract: WiringContract, shape: TreeShape | None) -> TreeShape:
    """The chain a block drafter proposes per round: all its drafts (`shape` None, or a tree shape, whose
    branching a block drafter has no use for), or a vLLM chain of k <= drafts per round (vLLM's
    num_speculative_tokens below B-1: the block is still drafted whole, the first k are verified)."""
    if contract.block is None:
        raise EaglewireError(
            "a block proposer needs a block drafter's contract",
            expected="contract.block",
            found=f"family {contract.family!r} without block wiring",
        )
    full = contract.block.drafts_per_round
    if shape is None or not shape.is_chain:
        return TreeShape.chain(full)
    if shape.num_steps > full:
        raise EaglewireError(
            f"a block of {contract.block.block_size} proposes at most {full} tokens per round",
            expected=f"--num-speculative-tokens <= {full}",
            found=str(shape.num_steps),
            fix="drop the knob (the whole block) or use a draft trained with a larger block",
        )
    return shape


class BlockProposer:
    def __init__(self, draft: DFlashDraft, contract: WiringContract, shape: TreeShape | None, max_len: int) -> None:
        if contract.block is None or contract.block != draft.block:
            raise EaglewireError(
                "the block proposer needs the draft's own block wiring",
                expected=str(draft.block),
                found=str(contract.block),
            )
        draft.cfg.require_matches(contract)  # the taps we will ask the target for are the draft's
        self.d, self.block = draft, contract.block
        self.taps = contract.taps
        self.k = block_shape(contract, shape).num_steps  # drafts verified per round
        first = 1 - self.block.label_offset  # the first slot that predicts a token after the anchor
        self.slots = torch.arange(first, first + self.k, device=draft.fc.weight.device)
        self.cache = draft.new_cache(max_len + self.block.block_size + 8)
        self.anchor = -1

    def start(self, prompt_ids: torch.Tensor, prompt_taps: torch.Tensor | None, first_token: int) -> None:
        self.cache.n = 0
        self._extend(prompt_taps)
        self.anchor = first_token

    def accept(self, taps: torch.Tensor | None, tokens: list[int]) -> None:
        self._extend(taps)  # [1, a+1, n*H]: the anchor and the accepted drafts, now verified
        self.anchor = tokens[-1]  # the target's bonus token: pending, the next block's anchor

    def _extend(self, taps: torch.Tensor | None) -> None:
        if taps is None:
            raise EaglewireError(
                "the block proposer got no target taps",
                expected=f"taps {list(self.taps)}",
                found="None",
                fix="the runtime must return the taps the proposer names",
            )
        self.d.extend_context(self.cache, taps)

    @torch.no_grad()
    def propose(self) -> DraftTree:
        normed = self.d.draft_block(self.cache, self.anchor)  # [1, B, H]
        tokens = self.d.target_ids(self.d.logits(normed[0, self.slots]).argmax(-1)).tolist()  # [k] target ids
        return DraftTree(tokens=tokens, parents=list(range(-1, self.k - 1)))
