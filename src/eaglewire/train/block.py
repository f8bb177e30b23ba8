"""DFlash's block objective: random anchors, every block of a sequence in one forward, weighted slot losses.

Notation as train/ttt.py: tokens x_0..x_{T-1}; target taps f_t (seen x_0..x_t); the target's final-norm state
h_t, whose logits predict x_{t+1}. A block anchored at p is [x_p, MASK x (B-1)] at positions p..p+B-1 (anchor
layout "bonus": slot 0 is the token the target just emitted, slot k >= 1 predicts x_{p+k}). At inference the
context is the target's states of every position before the anchor (the anchor itself is not yet in the
target's cache), so in training block j sees context positions < anchor_j, its own B slots bidirectionally,
and nothing of the other blocks (`block_mask`) — the recipe of SpecForge, speculators and DeepSpec.

Per sequence, up to `num_anchors` anchors are drawn without replacement among the positions p with
trained[p] and trained[p+1] (SpecForge's rule: the anchor and the first prediction are trained tokens),
sorted, padded with `keep` False. Slot k of a kept block is supervised where position p+k lies in the
sequence and is trained; its label is the target's at p+k-1: the distribution softmax(head(h_{p+k-1})) for
the soft losses (train.ttt.LOSSES; soft_ce is forward KL's gradient, speculators' default), or the target's
top-1 token (`greedy_ce`, cross-entropy on what a target-regenerated text holds). Slot weights
exp(-(k-1)/gamma), slot 0 weight 0 (`slot_weights`); the loss is sum(w * loss) over supervised slots divided
by their count over all ranks (times the world size: DDP's average then equals one process on the global
batch, as TTTModel does).

Statistics (TTTStats, one entry per drafted slot k = 1..B-1): top-1 agreement with the target per slot, and
`chain[k-1]`: the blocks whose B-1 slots are all supervised and whose slots 1..k all agree — greedy
verification of that block accepts exactly k drafts or more (the slots' inputs never depend on earlier
drafts: only the context and the anchor do), so 1 + sum(chain) / anchors is the teacher-forced tau of a
round at a random trained position.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.capture.features import FeatureBatch
from eaglewire.draft.blocks import block_inputs, block_mask, block_positions
from eaglewire.draft.vocab import draft_index
from eaglewire.train.ttt import LOSSES, TTTStats

Reducer = Callable[[torch.Tensor], torch.Tensor]


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B] float: 0 for slot 0 (the anchor, never predicted), exp(-(k-1)/gamma) for slot k >= 1."""
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, not {gamma}")
    k = torch.arange(block_size, dtype=torch.float64)
    return torch.where(k == 0, torch.zeros_like(k), torch.exp(-(k - 1) / gamma)).float()


def valid_anchors(trained: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: positions p with trained[p] and trained[p+1] (the last position never: nothing follows)."""
    t = trained.bool()
    out = torch.zeros_like(t)
    out[:, :-1] = t[:, :-1] & t[:, 1:]
    return out


def sample_anchors(
    valid: torch.Tensor, num_anchors: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `num_anchors` valid positions per row, drawn without replacement and sorted.

    valid [B, T] bool -> (anchors [B, N] long, keep [B, N] bool), N = min(num_anchors, the most valid positions
    of any row) (at least 1); a padding slot has anchor 0 and keep False. Draws on the CPU with `generator`."""
    rows = [r.nonzero().flatten() for r in valid.cpu()]
    n = max(1, min(num_anchors, max(len(r) for r in rows)))
    anchors = torch.zeros(len(rows), n, dtype=torch.long, device="cpu")
    keep = torch.zeros(len(rows), n, dtype=torch.bool, device="cpu")
    for i, cand in enumerate(rows):
        pick = cand[torch.randperm(len(cand), generator=generator)[:n]].sort().values
        anchors[i, : len(pick)], keep[i, : len(pick)] = pick, True
    return anchors.to(valid.device), keep.to(valid.device)


def block_labels(
    trained: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(supervised [B, Q] bool, source [B, Q] long): slot k >= 1 of a kept block is supervised where p+k < T
    and trained[p+k]; its label is the target's prediction from position p+k-1 (`source`, clamped in range)."""
    B, T = trained.shape
    pos = block_positions(anchors, block_size)  # [B, Q]
    slot = torch.arange(pos.shape[1], device=pos.device) % block_size  # [Q]
    inside = pos < T
    sup = keep.repeat_interleave(block_size, dim=1) & (slot > 0)[None] & inside
    sup &= trained.bool().gather(1, pos.clamp(max=T - 1))
    return sup, (pos - 1).clamp(0, T - 1)


class BlockModel(nn.Module):
    """A block draft plus its objective, as one module so DDP sees a single forward.

    `draft(ctx_taps [N, S, n*H], ctx_pos [N, S], block_ids [N, Q], block_pos [N, Q], mask [N, Q, S+Q]) -> hidden
    [N, Q, H]` and `draft.logits(hidden [..., H]) -> [..., V]` (the training-time forward of draft/dflash.py);
    `target_head` [V, H] the target's frozen LM head (soft labels, and the top-1 when batches do not bring it).
    `vocab` (d2t [V_d] offsets, t2d [V] bool): a reduced-vocabulary draft, whose logits are over V_d. As TTT's,
    its labels are the target's distribution renormalised over the draft vocabulary, and a row whose target
    top-1 lies outside it is not trained on but counts as a miss (no draft can propose that token)."""

    def __init__(
        self,
        draft: nn.Module,
        target_head: torch.Tensor,
        *,
        block_size: int,
        mask_token_id: int,
        num_anchors: int,
        gamma: float,
        loss: str = "soft_ce",
        seed: int = 0,
        world_size: int = 1,
        reduce_count: Reducer | None = None,
        vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}")
        if block_size < 2 or num_anchors < 1:
            raise ValueError(f"block_size >= 2 and num_anchors >= 1, not {block_size} and {num_anchors}")
        self.draft, self.target_head, self.loss_kind = draft, target_head, loss
        self.block_size, self.mask_token_id, self.num_anchors, self.seed = block_size, mask_token_id, num_anchors, seed
        self.register_buffer("weights", slot_weights(block_size, gamma), persistent=False)  # [Bk]
        self.world_size, self.reduce_count = world_size, reduce_count or (lambda x: x)
        self.d2t, self.t2d, self.label_head = None, None, target_head  # label_head [V_d or V, H]
        if vocab is not None:
            d2t, t2d = (v.to(target_head.device) for v in vocab)
            self.d2t, self.t2d = d2t, t2d
            self.draft_index = draft_index(t2d)  # [V] the draft id of each kept target id, -1 for the others
            # the target's logits over the draft vocab only: its head's rows of the kept ids (draft order)
            self.label_head = target_head[torch.arange(len(d2t), device=d2t.device) + d2t]

    def anchors(self, fb: FeatureBatch, trained: torch.Tensor, draw: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The anchors of this batch: a pure function of (seed, draw), so a resumed run draws the same ones and
        every held-out evaluation scores the same blocks."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + draw) % (2**63))
        return sample_anchors(valid_anchors(trained), self.num_anchors, g)

    def forward(self, fb: FeatureBatch, all_positions: bool = False, draw: int = 0) -> tuple[torch.Tensor, TTTStats]:
        """`all_positions`: prompt tokens are trained too; `draw` seeds the anchors (the loop's micro-batch index)."""
        B, T = fb.input_ids.shape
        Bk = self.block_size
        trained = (fb.attention_mask if all_positions else fb.loss_mask) > 0  # [B, T]
        anchors, keep = self.anchors(fb, trained, draw)  # [B, N] each
        ctx_pos = torch.arange(T, device=fb.input_ids.device).expand(B, T)
        hidden = self.draft(
            fb.taps,
            ctx_pos,
            block_inputs(fb.input_ids, anchors, Bk, self.mask_token_id),
            block_positions(anchors, Bk),
            block_mask(anchors, T, Bk),
        )  # [B, Q, H]
        sup, source = block_labels(trained, anchors, keep, Bk)  # [B, Q] each
        rows = sup.nonzero(as_tuple=True)
        slot = rows[1] % Bk  # [R] the slot of each supervised row
        logits = self.draft.logits(hidden[rows]).float()  # [R, V] or [R, V_d]
        src = (rows[0], source[rows])
        top1, per_row, used = self._loss(fb, src, logits)  # [R] each; used: rows in the loss
        drafted = logits.argmax(-1)  # [R] draft ids
        hit = (drafted + self.d2t[drafted] if self.d2t is not None else drafted) == top1  # [R]
        n = self.reduce_count(used.sum().to(torch.float64)).clamp_min(1)
        total = (self.weights[slot] * per_row * used).sum() / n.to(per_row.dtype) * self.world_size
        return total, self._stats(per_row.detach(), used, hit, slot, sup, rows, anchors.shape[1], keep)

    def _loss(
        self, fb: FeatureBatch, src: tuple[torch.Tensor, torch.Tensor], logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the target's top-1 [R], loss per row [R], rows in the loss [R] bool) for the supervised rows whose
        labels sit at `src`; a reduced vocabulary leaves out rows whose top-1 it lacks."""
        with torch.no_grad(), torch.autocast(logits.device.type, enabled=False):
            # labels in fp32 whatever the autocast dtype, as TTTModel's
            hid = fb.final_hidden[src].float()  # [R, H]
            if fb.target_top1 is not None:
                top1 = fb.target_top1[src].long()
            else:  # the full head's argmax (a reduced vocabulary's rows cannot say what lies outside them)
                top1 = (hid @ self.target_head.float().T).argmax(-1)
            want = None if self.loss_kind == "greedy_ce" else hid @ self.label_head.float().T  # [R, V or V_d]
            used = self.t2d[top1] if self.t2d is not None else torch.ones_like(top1, dtype=torch.bool)
            label = top1 if self.t2d is None else self.draft_index[top1].clamp_min(0)  # draft ids
        if self.loss_kind == "greedy_ce":
            return top1, F.cross_entropy(logits, label, reduction="none"), used
        return top1, LOSSES[self.loss_kind](logits, want), used

    def _stats(
        self,
        per_row: torch.Tensor,
        used: torch.Tensor,
        hit: torch.Tensor,
        slot: torch.Tensor,
        sup: torch.Tensor,
        rows: tuple[torch.Tensor, torch.Tensor],
        n_blocks: int,
        keep: torch.Tensor,
    ) -> TTTStats:
        Bk, st = self.block_size, TTTStats()
        for k in range(1, Bk):
            at, trained = slot == k, (slot == k) & used
            st.losses.append(float(per_row[trained].mean()) if trained.any() else 0.0)
            st.correct.append(int(hit[at].sum()))
            st.counts.append(int(at.sum()))
        hits = torch.zeros_like(sup)
        hits[rows] = hit
        hits = hits.view(-1, n_blocks, Bk)[:, :, 1:]  # [B, N, Bk-1]
        full = sup.view(-1, n_blocks, Bk)[:, :, 1:].all(-1) & keep  # [B, N] blocks with every slot supervised
        run = hits.long().cumprod(-1) * full[:, :, None]  # [B, N, Bk-1] slots 1..k all right
        st.chain = [int(c) for c in run.sum((0, 1)).tolist()]
        st.anchors = int(full.sum())
        return st
