"""Test helpers for DFlash against real engines: a quick fit of a draft to known continuations (so acceptance
is far from zero and an engine that wires it differently shows), and eaglewire's greedy DFlash acceptance
on a known greedy continuation.

Greedy verification is lossless, so the target's greedy continuation x is the output whatever the draft
proposes; a round anchored at position p (x[p] is the token the target just emitted, not yet in the
context) runs the draft once over [x[p], MASK x (B-1)] with the context's taps at positions < p, and
accepts the leading drafts equal to x[p+1..]. The taps of the whole continuation are captured in one
forward (the target is causal, so a prefix's states are the same states).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglewire.capture.hooks import capture


def greedy_continuation(target, prompt: torch.Tensor, n: int) -> list[int]:
    """The target's own greedy tokens after `prompt` [1, P] (HF generate, fp32)."""
    with torch.no_grad():
        out = target.model.generate(
            prompt,
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            attention_mask=torch.ones_like(prompt),
        )
    return out[0, prompt.shape[1] :].tolist()


def fit(target, draft, seqs: list[torch.Tensor], starts: list[int], steps: int, lr: float = 5e-3) -> list[float]:
    """Fit `draft` to predict each sequence's own tokens: every anchor p >= start, slot k -> x[p+k], all blocks of a
    sequence in one forward (block j sees the context before its anchor and itself). Returns the losses."""
    B, mask_id = draft.block.block_size, draft.block.mask_token_id
    taps = [capture(target, draft.contract.taps, s).taps.detach() for s in seqs]  # [1, T, n*H]
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=lr)
    losses = []
    draft.train()
    for step in range(steps):
        i = step % len(seqs)
        x, T = seqs[i][0], seqs[i].shape[1]
        p = torch.arange(starts[i], T - B + 1)  # [n] anchors
        n = p.shape[0]
        block = torch.full((n, B), mask_id, dtype=torch.long)
        block[:, 0] = x[p]
        pos = p[:, None] + torch.arange(B)[None]  # [n, B]
        own = torch.arange(n).repeat_interleave(B)  # block of each query row
        mask = torch.cat([torch.arange(T)[None] < p[own][:, None], own[:, None] == own[None]], -1)  # [nB, T+nB]
        hidden = draft(taps[i], torch.arange(T)[None], block.view(1, -1), pos.view(1, -1), mask[None])  # [1, nB, H]
        logits = draft.logits(hidden.view(n, B, -1)[:, 1:])  # [n, B-1, V or V_d]: slot k predicts x[p+k]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), _draft_ids(draft, x[pos[:, 1:]].reshape(-1)), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    draft.eval()
    return losses


def _draft_ids(draft, ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> the draft's output ids (a reduced vocabulary's; -100 where it lacks the token)."""
    if not draft.reduced:
        return ids
    return torch.where(draft.t2d[ids], draft.t2d.long().cumsum(0)[ids] - 1, -100)


@torch.no_grad()
def greedy_acceptance(target, draft, prompt: torch.Tensor, cont: list[int], max_new: int) -> list[int]:
    """Accepted drafts per round of eaglewire's DFlash draft on the target's greedy continuation `cont` (which
    must run B tokens past `max_new`); rounds stop once `max_new` tokens are out, as an engine's do."""
    B, P = draft.block.block_size, prompt.shape[1]
    x = torch.cat([prompt[0], torch.tensor(cont)])
    taps = capture(target, draft.contract.taps, x[None]).taps  # [1, T, n*H]
    cache = draft.new_cache(x.shape[0] + B)
    accepted, p = [], P  # x[P] is the first token out (from the prefill)
    while p - P + 1 < max_new:
        draft.extend_context(cache, taps[:, cache.n : p])
        drafts = draft.target_ids(draft.logits(draft.draft_block(cache, int(x[p]))[0, 1:]).argmax(-1)).tolist()
        a = 0
        while a < B - 1 and drafts[a] == int(x[p + 1 + a]):
            a += 1
        accepted.append(a)
        p += a + 1
    return accepted
