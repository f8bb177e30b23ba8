"""Training-time test (EAGLE-3): unroll the draft k steps on its own hidden states, as at inference.

Notation: tokens x_0..x_{T-1}; target taps f_t (seen x_0..x_t); target logits p_t predict x_{t+1}.
Step k at position t feeds the draft (state, x_{t+1+k}) at position id t+k, where state is fc(f_t) for
k = 0 and the draft's own output of step k-1 at t otherwise, and supervises it with p_{t+1+k}
(the target's distribution for x_{t+2+k}). Keys visible to step k at t: step-0 keys of every j <= t
(the accepted prefix) plus the step-1..k keys of position t itself (its own draft chain) — exactly
the draft's KV at inference after accepting x_0..x_{t+1} and drafting k tokens.

Loss per step (`LOSSES`), with p' = softmax(p_{t+1+k}[t2d]) the target's distribution renormalised over the
draft vocab and q the draft's: soft cross-entropy -sum_v p'(v) log q(v) (default), forward KL = CE - H(p'),
or one that aims at acceptance itself — `nla` -log alpha and `lk_hybrid` (KL blended into TV = 1 - alpha by
exp(-eta sg[alpha])), alpha = sum_v min(p', q) the sampling acceptance rate (Samarin et al., "LK Losses",
arXiv 2602.23881; the same definitions as speculators' losses/eager.py) — or `greedy_ce`, cross-entropy on the
target's top-1 only: under greedy verification the target *is* that point mass, and -log alpha reduces to it.
On positions whose predicted token x_{t+2+k} is trained (loss mask) and whose target top-1 lies in the draft
vocab; step weight decay**k.

Optionally (`feature_weight` w > 0) a feature loss in the spirit of EAGLE-1's, aimed at the logits: w times the
mean squared centred-logit error over the *whole* target vocabulary between the draft's final-norm state at
step k, carried into the target's state space by a fixed linear map A, and the target's final-norm state
h_{t+1+k} (the state whose head gives p_{t+1+k}): (A s - h)^T G (A s - h) with G = W_c^T W_c / V the Gram matrix
of the centred target head, O(H^2) per position instead of O(V H). On every trained position, tokens outside
the draft vocab included, which the distribution loss never sees. A is the least-squares map from the draft's
head to the target's (train.eagle3.feature_space; the identity for a fresh draft, whose head starts as the
target's rows): a warm-started draft's state lives in its own head's space, where the raw cosine to h is low.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.capture.features import FeatureBatch
from eaglewire.draft.model import Eagle3Draft
from eaglewire.draft.unroll import shift_left, ttt_attention_mask  # the unroll the doctor shares


LK_ETA = 3.0  # lk_hybrid's blend temperature: the paper's best setting (and speculators' default)


def _soft_ce(logq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return -(p * logq).sum(-1)


def soft_ce_loss(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[N, V_d] logits each -> [N]: -sum p log q."""
    return _soft_ce(F.log_softmax(draft, -1), F.softmax(target, -1))


def forward_kl_loss(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = CE - H(p): the same gradient as soft CE, a loss that reaches 0."""
    p = F.softmax(target, -1)
    return _soft_ce(F.log_softmax(draft, -1), p) + (p * torch.log(p.clamp_min(1e-30))).sum(-1)


def _overlap(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[N] alpha = sum_v min(p, q): the acceptance probability of rejection sampling at temperature 1."""
    return torch.minimum(F.softmax(draft, -1), F.softmax(target, -1)).sum(-1)


def nla_loss(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-log alpha: TV's gradient scaled by 1/alpha, so it does not vanish while the overlap is small."""
    return -torch.log(_overlap(draft, target).clamp_min(1e-6))


def lk_hybrid_loss(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """lambda KL + (1 - lambda) TV with lambda = exp(-eta sg[alpha]): KL's strong gradient while the
    draft is far off, acceptance itself once it overlaps."""
    alpha = _overlap(draft, target)
    lam = torch.exp(-LK_ETA * alpha.detach())
    return lam * forward_kl_loss(draft, target) + (1 - lam) * (1 - alpha)


def greedy_ce_loss(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the target's top-1: greedy verification accepts exactly when the argmaxes agree."""
    return F.cross_entropy(draft, target.argmax(-1), reduction="none")


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "soft_ce": soft_ce_loss,
    "forward_kl": forward_kl_loss,
    "nla": nla_loss,
    "lk_hybrid": lk_hybrid_loss,
    "greedy_ce": greedy_ce_loss,
}


@dataclass
class TTTStats:
    losses: list[float] = field(default_factory=list)  # per step, normalised like the loss
    correct: list[int] = field(default_factory=list)  # per step, draft top-1 == target top-1
    counts: list[int] = field(default_factory=list)  # per step, supervised positions (this rank)
    # Chain acceptance, teacher-forced: anchors whose next `steps` tokens are all answer tokens; chain[k] counts
    # those whose steps 0..k were all right (a token outside the draft vocab is a miss), as greedy verification
    # of a k-chain accepts. 1 + sum(chain) / anchors approximates tau (anchored at every position, not only at
    # round starts).
    chain: list[int] = field(default_factory=list)
    anchors: int = 0
    # The same chains walked as a greedy decoder walks them (`simulate_rounds`): a round starts only where
    # the previous one ended. tau_rounds = round_tokens / rounds is what a decoder measures online.
    round_tokens: int = 0
    rounds: int = 0


def round_starts(anchor: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the anchors where greedy chain decoding over this teacher-forced text starts a round.
    anchor [B, T] bool, accepted [B, T] drafts a k-chain anchored there gets accepted (0..k). A round at
    anchor s yields accepted + 1 tokens (the bonus is the target's) and the next one starts at s + accepted
    + 1; a position that is no anchor (the last k of an answer) ends the answer, and the next answer starts
    at its first anchor."""
    starts = torch.zeros_like(anchor)
    for b, (row_anchor, row_acc) in enumerate(zip(anchor.tolist(), accepted.tolist())):
        s, T = 0, len(row_anchor)
        while s < T:
            if not (row_anchor[s] and (s == 0 or not row_anchor[s - 1])):
                s += 1  # not an answer's first anchor: prompt, or the tail an answer's last round left
                continue
            while s < T and row_anchor[s]:  # one answer, round by round
                starts[b, s] = True
                s += row_acc[s] + 1
    return starts


def simulate_rounds(anchor: torch.Tensor, accepted: torch.Tensor) -> tuple[int, int]:
    """(tokens, rounds) of greedy chain decoding over teacher-forced text (`round_starts`). Anchored at every
    position instead, the mean overstates tau: a round mostly starts right after a rejection, where the
    draft does worse than on average (benchmarks/recipe/round_starts.py measures the difference)."""
    starts = round_starts(anchor, accepted)
    return int((accepted + 1)[starts].sum()), int(starts.sum())


Reducer = Callable[[torch.Tensor], torch.Tensor]  # sums a count over ranks (identity on one process)


class TTTModel(nn.Module):
    """The draft plus its TTT loss, as one module so DDP sees a single forward."""

    def __init__(
        self,
        draft: Eagle3Draft,
        target_head: torch.Tensor | None,
        *,
        steps: int,
        decay: float,
        loss: str = "soft_ce",
        world_size: int = 1,
        reduce_count: Reducer | None = None,
        draft_head: torch.Tensor | None = None,
        round_weight: float = 0.0,
        feature_weight: float = 0.0,
        feature_space: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """`target_head` [V, H_t] the full frozen head; or None with `draft_head` [V_d, H_t], its rows for
        the draft vocab, when every batch brings the target's top-1 (offline training keeps V_d rows only).
        `round_weight` w: in training, the chains anchored where a greedy decoder would start a round under
        the current draft (`round_starts`) weigh 1 + w, the others 1 (online tau is made of those only)."""
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}")
        if (target_head is None) == (draft_head is None):
            raise ValueError("give the full target head or its draft-vocab rows, exactly one")
        self.draft, self.steps, self.decay, self.loss_kind = draft, steps, decay, loss
        self.target_head = target_head  # [V, H_t] frozen target lm_head (not a parameter), or None
        # The loss reads the target's logits over the draft vocab only: slicing the head to those rows
        # once (ascending target id = draft order) costs V_d/V of the full [B, T, V] product (1/6 here).
        if draft_head is None:
            draft_head = target_head[
                torch.arange(draft.cfg.draft_vocab_size, device=target_head.device) + draft.d2t.to(target_head.device)
            ]
        self.draft_head = draft_head  # [V_d, H_t]
        self.world_size, self.reduce_count = world_size, reduce_count or (lambda x: x)
        if round_weight < 0:
            raise ValueError(f"round_weight must be >= 0, not {round_weight}")
        self.round_weight = round_weight
        if feature_weight < 0:
            raise ValueError(f"feature_weight must be >= 0, not {feature_weight}")
        if feature_weight > 0 and feature_space is None:
            raise ValueError("feature_weight > 0 needs feature_space: (the target head's Gram matrix G, the map A)")
        self.feature_weight, self.feature_space = feature_weight, feature_space  # ([H, H] G, [H, H] A)

    def target_top1(self, fb: FeatureBatch) -> torch.Tensor:
        """[B, T] the target's greedy token after each position: stored at capture, else the full head."""
        if fb.target_top1 is not None:
            return fb.target_top1.long()
        if self.target_head is None:
            raise ValueError("this batch has no stored target top-1 and the model holds no full target head")
        return (fb.final_hidden.float() @ self.target_head.float().T).argmax(-1)

    def forward(self, fb: FeatureBatch, all_positions: bool = False, draw: int = 0) -> tuple[torch.Tensor, TTTStats]:
        """`all_positions` also supervises prompt tokens (the target's distribution there is as real; the
        draft runs over them anyway): more signal per step. Evaluation always scores answers only. `draw`
        (the loop's seed for an objective's random choices) is unused: TTT supervises every position."""
        d = self.draft
        B, T = fb.input_ids.shape
        # Targets in fp32 whatever the autocast dtype: soft labels are compared across TTT steps and runs.
        with torch.no_grad(), torch.autocast(fb.input_ids.device.type, enabled=False):
            in_vocab = d.t2d[self.target_top1(fb)]  # [B, T] target top-1 representable by the draft
            p_draft = fb.final_hidden.float() @ self.draft_head.float().T  # [B, T, V_d]; p_t predicts x_{t+1}
        hidden, past = d.fuse(fb.taps), None  # [B, T, H]
        total, stats = fb.taps.new_zeros(()), TTTStats()
        terms: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]] = []  # per step: (rows, loss per row [N])
        anchor = torch.ones_like(fb.loss_mask, dtype=torch.bool)  # [B, T]
        for k in range(self.steps):
            anchor &= shift_left(fb.loss_mask, 2 + k) > 0
        chain = anchor.clone()  # [B, T] anchors whose steps so far were all right
        accepted = torch.zeros_like(fb.input_ids)  # [B, T] drafts a chain anchored there gets accepted
        stats.anchors = int(anchor.sum())
        base_pos = torch.arange(T, device=fb.input_ids.device).expand(B, T)
        for k in range(self.steps):
            out = d.step(
                shift_left(fb.input_ids, 1 + k),
                hidden,
                base_pos + k,
                ttt_attention_mask(T, k, fb.input_ids.device),
                past,
                compute_logits=False,
            )
            hidden, past = out.hidden, out.kv
            trained = fb.attention_mask if all_positions else fb.loss_mask
            mask = (shift_left(trained, 2 + k) > 0) & shift_left(in_vocab, 1 + k, False)  # [B, T]
            rows = mask.nonzero(as_tuple=True)
            # head and softmax only at supervised positions: p_{t+1+k} sits at column t+1+k of p_draft
            per_pos, hit = self._step_loss(d.lm_head(out.normed[rows]), p_draft[rows[0], rows[1] + 1 + k])
            if self.feature_weight > 0 and self.training:  # held-out losses stay comparable across runs
                terms.append(self._with_feature_loss(per_pos, rows, out.normed, fb, trained, k))
            else:
                terms.append((rows, per_pos))
            hit_bt = torch.zeros_like(chain)
            hit_bt[rows] = hit
            chain &= hit_bt
            accepted += chain
            stats.chain.append(int(chain.sum()))
            stats.correct.append(int(hit.sum()))
            stats.counts.append(int(rows[0].numel()))
        weighted = self.training and self.round_weight > 0
        starts = round_starts(anchor, accepted) if weighted else None  # a Python walk over [B, T]: only if used
        for k, (rows, per_pos) in enumerate(terms):
            # rows are chain anchors t (the step-k prediction of the chain that starts at t)
            weight = 1 + self.round_weight * starts[rows].to(per_pos.dtype) if weighted else None
            loss_k = self._reduce(per_pos, weight)
            total = total + self.decay**k * loss_k
            stats.losses.append(float(loss_k.detach()))
        if not self.training:  # evaluation is never weighted: the walk runs here once
            stats.round_tokens, stats.rounds = simulate_rounds(anchor, accepted)
        return total, stats

    def _with_feature_loss(
        self,
        per_pos: torch.Tensor,
        rows: tuple[torch.Tensor, ...],
        normed: torch.Tensor,
        fb: FeatureBatch,
        trained: torch.Tensor,
        k: int,
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """(every trained row, loss per row): per_pos [N] (the distribution loss at `rows`) placed on the trained
        rows ⊇ rows (zero where the target's top-1 is outside V_d) plus w times the centred-logit MSE of the
        mapped draft state against h_{t+1+k} (module docstring), so one reduction counts every trained position
        once."""
        feat_rows = (shift_left(trained, 2 + k) > 0).nonzero(as_tuple=True)  # ⊇ rows
        want = fb.final_hidden[feat_rows[0], feat_rows[1] + 1 + k].float()  # [M, H]
        gram, amap = self.feature_space
        diff = normed[feat_rows].float() @ amap.T - want  # [M, H] in the target's state space
        feat = ((diff @ gram) * diff).sum(-1)  # [M] mean squared centred-logit error over the target vocab
        dist = normed.new_zeros(normed.shape[:2], dtype=torch.float32)  # [B, T] the distribution loss, 0 off rows
        dist[rows] = per_pos.float()
        return feat_rows, dist[feat_rows] + self.feature_weight * feat

    def _step_loss(self, draft_logits: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows are the supervised positions, [N, V_d] each -> (loss per row [N], draft top-1 == target top-1 [N])."""
        per_pos = LOSSES[self.loss_kind](draft_logits.float(), target_logits.float())  # [N]
        return per_pos, draft_logits.argmax(-1) == target_logits.argmax(-1)

    def _reduce(self, per_pos: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """(Weighted) sum / (rows, or their weights, over ALL ranks) * world size: DDP's gradient averaging
        then yields exactly the single-process gradient of the global batch."""
        num = per_pos.sum() if weight is None else (weight * per_pos).sum()
        den = float(per_pos.numel()) if weight is None else float(weight.sum())
        n = self.reduce_count(torch.tensor(den, dtype=torch.float64, device=per_pos.device)).clamp_min(1)
        return num / n.to(per_pos.dtype) * self.world_size
