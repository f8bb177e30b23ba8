"""Proposers: who drafts the candidate tree each round (transformers-style protocol).

    start(prompt_ids, prompt_taps, first_token)   after prefill; first_token is pending (not verified yet)
    propose() -> DraftTree                         candidates to verify after the pending token
    accept(taps, tokens)                           the round's committed positions: taps [1, a+1, n*H] of the
                                                   root and the accepted nodes, tokens = accepted + bonus
`taps` names the target boundaries a proposer needs from every verify forward (EAGLE-3: the contract's).
Test doubles (an always-right and a random proposer) live in tests/proposers.py.

Which proposer a draft decodes with (by the family its contract names) is chosen in one place, the
family record's "decoding" part (eaglewire.families, registered by eaglewire.compose).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from eaglewire.contract import WiringContract
from eaglewire.draft.model import DraftCache, Eagle3Draft
from eaglewire.decoding.tree import DraftTree, TreeShape


class Proposer(Protocol):
    taps: tuple[int, ...]

    def start(self, prompt_ids: torch.Tensor, prompt_taps: torch.Tensor | None, first_token: int) -> None: ...

    def propose(self) -> DraftTree: ...

    def accept(self, taps: torch.Tensor | None, tokens: list[int]) -> None: ...


class Drafter(Protocol):
    """A decoding copy of a draft: `model` is called exactly like the Eagle3Draft it copies, `argmax` is its
    greedy head on final-norm states [B, R, H] -> draft ids [B, R]."""

    model: Any

    def argmax(self, normed: torch.Tensor) -> torch.Tensor: ...


class EagleProposer:
    """EAGLE-3 drafting. Committed draft entries j pair the target's taps at position j with token x_{j+1}
    (as in training); they live in a static DraftCache. Each round's tree nodes are written after them and
    overwritten by the next round's committed entries."""

    def __init__(
        self,
        draft: Eagle3Draft,
        shape: TreeShape,
        max_len: int,
        drafter: Drafter | None = None,
        *,
        contract: WiringContract | None = None,
    ) -> None:
        """drafter: a decoding copy of `draft` that runs it faster (eaglewire.fastcpu.draft.FastDraft); None
        runs the draft's own modules. contract: the wiring to decode with, the draft's own by default (the
        doctor decodes with other taps)."""
        contract = contract if contract is not None else draft.contract
        if contract is None:
            raise ValueError("the draft carries no contract (built by hand?): pass contract=")
        draft.cfg.require_matches(contract)  # the taps we will ask the target for are the draft's
        self.lean = drafter
        self.d = draft if drafter is None else drafter.model
        self.shape = shape
        self.taps = contract.taps
        self.cache = DraftCache(
            draft.cfg,
            1,
            max_len + shape.num_draft_tokens * shape.num_steps + 8,
            dtype=draft.fc.weight.dtype,
            device=draft.fc.weight.device,
        )
        self.n = 0  # committed draft entries (= target tokens in the target's cache)
        self.dev = draft.fc.weight.device  # every tensor a round makes goes where the draft is

    @torch.no_grad()
    def _extend(self, taps: torch.Tensor, tokens: list[int]) -> None:
        """Append entries for positions n..n+T-1: (taps[t], tokens[t]); keep the last one's output. The taps
        come in the target's dtype and are read in the draft's (an fp32 target may have a bf16 draft:
        hw.draft_dtype)."""
        ids = torch.tensor([tokens], device=self.dev)
        out = self.d(ids, taps.to(self.dev, self.cache.k.dtype), cache=self.cache, start=self.n, compute_logits=False)
        self.n += len(tokens)
        self.last_normed, self.last_hidden = out.normed[:, -1:], out.hidden[:, -1:]  # [1, 1, H] each

    def _argmax(self, normed: torch.Tensor) -> int:
        """A chain step's draft token from its final-norm state [1, 1, H] (the drafter's greedy head, where one is given)."""
        return int(self.lean.argmax(normed) if self.lean is not None else self.d.lm_head(normed).argmax(-1))

    def start(self, prompt_ids: torch.Tensor, prompt_taps: torch.Tensor | None, first_token: int) -> None:
        prompt_taps = _required(prompt_taps)
        self.n = 0
        # draft id i -> target id i + d2t[i], in Python (a chain maps one id per step); read per generation:
        # with layout="module" d is the caller's draft
        self.d2t = self.d.d2t.tolist()
        self._extend(prompt_taps, prompt_ids[0, 1:].tolist() + [first_token])

    def accept(self, taps: torch.Tensor | None, tokens: list[int]) -> None:
        self._extend(_required(taps), tokens)

    @torch.no_grad()
    def propose(self) -> DraftTree:
        return self._propose_chain() if self.shape.is_chain else self._propose_tree()

    @torch.no_grad()
    def _propose_tree(self) -> DraftTree:
        """Beam-style tree expansion: every level feeds the K best-scoring frontier nodes, each adds its K
        best children (summed log-probabilities); `_select` keeps the N-1 best nodes."""
        K, S = self.shape.topk, self.shape.num_steps
        logp = torch.log_softmax(self.d.lm_head(self.last_normed)[0, -1].float(), -1)  # [V_d]
        top = logp.topk(K)
        # candidate nodes: (score, parent, draft id); frontier nodes also carry the hidden they are fed with
        scores, parents, ids = top.values.tolist(), [-1] * K, top.indices.tolist()
        frontier = list(range(K))
        hidden = self.last_hidden.expand(1, K, -1)  # every level-1 node is fed the root step's output
        slot = self.n  # first free cache slot; node fed at level d sits at position n - 2 + d
        fed: dict[int, int] = {}  # node -> cache slot it was fed at (for descendants' masks)
        for level in range(2, S + 1):
            toks = self.d.to_target_ids(torch.tensor([ids[f] for f in frontier], device=self.dev))[
                None
            ]  # [1, F] target ids
            mask = self._mask(frontier, parents, fed, slot)
            for j, f in enumerate(frontier):
                fed[f] = slot + j
            pos = torch.full((1, len(frontier)), self.n - 2 + level, device=self.dev)
            out = self.d.step(toks, hidden, pos, mask, cache=self.cache, start=slot)
            slot += len(frontier)
            assert out.logits is not None  # step() computes them unless told not to
            child = torch.log_softmax(out.logits[0].float(), -1).topk(K)  # [F, K]
            cand = (torch.tensor([scores[f] for f in frontier], device=self.dev)[:, None] + child.values).flatten()
            base = len(scores)
            for j, f in enumerate(frontier):
                for c in range(K):
                    scores.append(float(cand[j * K + c]))
                    parents.append(f)
                    ids.append(int(child.indices[j, c]))
            best = cand.topk(min(K, cand.numel())).indices.tolist()
            frontier = [base + b for b in best]
            hidden = out.hidden[:, [b // K for b in best]]  # children are fed their parent's output
        return self._select(scores, parents, ids)

    @torch.no_grad()
    def _propose_chain(self) -> DraftTree:
        """The tree walk for topk = 1 without its bookkeeping: each step feeds the previous draft token
        at the next slot and keeps its argmax. Every node then sees all committed entries and every earlier
        node, so no mask is needed, and the argmax of the logits is the tree's log-softmax top-1 (a monotone
        map), taken through the lean copy's greedy head (exact; screened where calibrated faster). Why: a chain
        is vLLM's default and the common case, and a round's drafting is a few memory-bound forwards plus a few
        hundred small ops (tested: the same tokens as the tree walk)."""
        ids = [self._argmax(self.last_normed)]  # draft-vocab ids, level 1..S
        hidden = self.last_hidden  # [1, 1, H]: the root step's output feeds level 2
        for level in range(2, self.shape.num_steps + 1):
            tok = torch.tensor([[ids[-1] + self.d2t[ids[-1]]]], device=self.dev)  # [1, 1] target id
            pos = torch.tensor([[self.n - 2 + level]], device=self.dev)
            out = self.d.step(tok, hidden, pos, None, cache=self.cache, start=self.n + level - 2, compute_logits=False)
            ids.append(self._argmax(out.normed))
            hidden = out.hidden  # [1, 1, H]
        return DraftTree(tokens=[i + self.d2t[i] for i in ids], parents=list(range(-1, len(ids) - 1)))

    def _mask(self, frontier: list[int], parents: list[int], fed: dict[int, int], slot: int) -> torch.Tensor:
        """Frontier node j (written at slot+j) sees the committed entries, itself, and its fed ancestors."""
        F_ = len(frontier)
        mask = torch.zeros(F_, slot + F_, dtype=torch.bool, device=self.dev)
        mask[:, : self.n] = True
        for j, f in enumerate(frontier):
            mask[j, slot + j] = True
            p = parents[f]
            while p >= 0:
                mask[j, fed[p]] = True
                p = parents[p]
        return mask[None, None]

    def _select(self, scores: list[float], parents: list[int], ids: list[int]) -> DraftTree:
        """Keep the N-1 best-scoring nodes (a child never outscores its parent; ties go to the shallower),
        re-indexed in topological order, as target ids."""
        n_keep = self.shape.num_draft_tokens - 1
        depth: list[int] = []
        for p in parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        keep = sorted(
            sorted(range(len(scores)), key=lambda i: (-scores[i], depth[i]))[:n_keep], key=lambda i: (depth[i], i)
        )
        kept = set(keep)
        keep = [i for i in keep if all(a in kept for a in _ancestors(i, parents))]
        index = {old: new for new, old in enumerate(keep)}
        target_ids = self.d.to_target_ids(torch.tensor([ids[i] for i in keep], device=self.dev)).tolist()
        return DraftTree(tokens=target_ids, parents=[index[parents[i]] if parents[i] >= 0 else -1 for i in keep])


def _required(taps: torch.Tensor | None) -> torch.Tensor:
    """The target's taps, which an EAGLE-3 draft reads at every position (a runtime asked for `taps` gives them)."""
    if taps is None:
        raise ValueError("an EAGLE-3 proposer needs the target's taps from every forward; the runtime gave none")
    return taps


def _ancestors(i: int, parents: list[int]) -> list[int]:
    out, p = [], parents[i]
    while p >= 0:
        out.append(p)
        p = parents[p]
    return out
