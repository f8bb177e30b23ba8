"""FastDraft: the draft's GEMMs on the fast runtime's layouts. A decoding copy of an Eagle3Draft whose
Linears run as `gemm.Gemm` (oneDNN's prepacked weight where this torch and CPU offer it, else the fastest
plain matmul), q/k/v and gate/up fused into one GEMM each (as the target runtime does), everything else
(norm flags, attention, RoPE) the draft's own tested code.

Why: drafting is a few 1-4 row GEMMs per round, and nn.Linear's layout is among the slowest for so few
rows, so drafting would cost a large share of a round beside verifying. Which layout wins differs by
machine, row count and dtype, so the copy measures it (`calibrate`, a fraction of a second for a small
draft) instead of assuming it. `python -m benchmarks.decoding.bench_draft` measures a round's drafting cost through
nn.Linear and through these layouts side by side.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from eaglewire.fastcpu.gemm import (
    CacheFlush,
    Gemm,
    candidate_layouts,
    hold_only,
    initial_policy,
    pick,
    row_counts,
    time_layouts,
)
from eaglewire.fastcpu.screened_head import SCREENED, ScreenedHead, default_head, greedy_heads
from eaglewire.draft.model import DraftCache, Eagle3Draft
from eaglewire.hw import return_freed_memory

# row counts timed (a draft step / accepted runs of 2-3 and of 4+; 2 apart from 1 because the compiled GEMV
# is one row only), repetitions each
DRAFT_ROWS, DRAFT_REPS = (1, 2, 4), 5


class LayoutLinear(nn.Module):
    """nn.Linear's forward through `gemm.Gemm` (one module's, or several fused side by side); the layout
    is looked up per row count in a policy {rows: layout} shared by every Gemm of one draft (the largest
    rows key <= the call's rows)."""

    def __init__(self, lins: list[nn.Linear], policy: dict[int, str], layouts: tuple[str, ...]) -> None:
        super().__init__()
        self.lin = Gemm.fused(lins, layouts)  # one module: its own weight (and bias)
        self.policy = policy
        self.out_features = sum(m.out_features for m in lins)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return self.lin(x, pick(self.policy, x.numel() // x.shape[-1]))


class FastDraft:
    """A decoding copy of `draft` (shares the target's embedding, not the caller's Linears) plus its
    layout policy. `model` is called exactly like the Eagle3Draft it copies."""

    def __init__(self, draft: Eagle3Draft, layout: str = "auto", compiled: bool = True, calibrate: bool = True) -> None:
        """compiled=False: the one-row compiled GEMV is no candidate (nothing compiles, no inductor probe).
        calibrate=False: "auto" keeps the uncalibrated policy (beside a runtime that measured nothing either)."""
        dtype = draft.fc.weight.dtype
        self.candidates = candidate_layouts(dtype, compiled)
        if layout != "auto" and layout not in self.candidates:
            raise ValueError(f"layout {layout!r} is not available here (one of {self.candidates})")
        self.policy: dict[int, str] = initial_policy(layout)
        emb = draft.embed_tokens.weight
        self.model = copy.deepcopy(draft, memo={id(emb): emb})  # the [V, H] embedding stays shared
        # a chain needs only each step's argmax: the head's bf16 screen where offered (screened_head.py), an
        # exact argmax that reads half the head's bytes and lets the draft's weights stay in cache
        # (fp32 drafts only: `--draft-dtype target` or float32; the default bf16 draft already reads bf16)
        self.head_candidates = greedy_heads(dtype)
        self.screen = ScreenedHead(draft.lm_head.weight, packed=True) if SCREENED in self.head_candidates else None
        self.head_policy: dict[int, str] = {1: default_head(self.head_candidates)}
        self.head_ms: dict[int, dict[str, float]] = {}
        lays = self.candidates
        for layer in self.model.layers:  # fused first: the separate modules are then dropped (never called)
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv = LayoutLinear([attn.q_proj, attn.k_proj, attn.v_proj], self.policy, lays)
            mlp.gate_up = LayoutLinear([mlp.gate_proj, mlp.up_proj], self.policy, lays)
            attn.q_proj = attn.k_proj = attn.v_proj = mlp.gate_proj = mlp.up_proj = None
        for parent in list(self.model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LayoutLinear([child], self.policy, lays))
        self.model.eval()
        self.calibration_ms: dict[int, dict[str, float]] = {}
        if layout == "auto" and calibrate:
            self.calibrate()
        self.settle_copies()

    def _linears(self) -> list[Gemm]:
        return [m.lin for m in self.model.modules() if isinstance(m, LayoutLinear)]

    def settle_copies(self) -> int:
        """Hold exactly the weight copies the policy reads (built now where absent) and free the head's
        screen where the head policy never picks it (fastcpu.runtime.FastRuntime.settle_copies has why); returns the
        bytes freed."""
        freed = hold_only(self._linears(), set(self.policy.values()))
        if self.screen is not None and SCREENED not in self.head_policy.values():
            freed, self.screen = freed + self.screen.nbytes(), None
        elif self.screen is None and SCREENED in self.head_policy.values():
            self.screen = ScreenedHead(self.model.lm_head.lin.w, packed=True)  # freed before, picked now
        if freed:
            return_freed_memory()
        return freed

    @torch.no_grad()
    def calibrate(self, rows: tuple[int, ...] = DRAFT_ROWS, reps: int = DRAFT_REPS) -> dict[int, str]:
        """Time a whole draft forward per layout and row count (layouts interleaved within each repetition,
        as the target's calibration does; gemm.row_counts adds 2 where the one-row GEMV needs it), each
        after a CacheFlush: decoding meets the draft's weights after the target's forward has evicted them.
        Keep the fastest per row count; then time the greedy heads the same way, each after a flush and an
        untimed 1-row forward (a chain step's order)."""
        for lin in self._linears():  # every candidate is timed: each its copies
            lin.prepare(self.candidates)
        if self.screen is None and SCREENED in self.head_candidates:
            self.screen = ScreenedHead(self.model.lm_head.lin.w, packed=True)
        cfg, w = self.model.cfg, self.model.fc.lin.w
        rows = row_counts(rows, self.candidates)
        cache = DraftCache(cfg, 1, 16 + max(rows), dtype=w.dtype, device=w.device)
        inputs = {
            r: (
                torch.zeros(1, r, dtype=torch.long, device=w.device),  # [1, r] ids, [1, r, n*H_t] taps
                torch.zeros(1, r, cfg.num_taps * cfg.target_hidden_size, dtype=w.dtype, device=w.device),
            )
            for r in rows
        }
        flush = CacheFlush()

        def run(layout: str, r: int) -> None:
            self._set({1: layout})
            self.model(*inputs[r], cache=cache, start=16)

        best, self.calibration_ms = time_layouts(self.candidates, rows, reps, run, before=flush)
        self._set(best)
        states: list[torch.Tensor] = []

        def state() -> None:  # the forward whose final-norm state [1, 1, H] the head reads
            states[:] = [self.model(*inputs[rows[0]], cache=cache, start=16, compute_logits=False).normed[:, -1:]]

        def step() -> None:  # untimed, before each timed head call: flush, then a chain step's forward
            flush()
            state()

        def run_head(head: str, _rows: int) -> None:
            self.head_policy = {1: head}
            self.argmax(states[0])

        state()  # for the untimed warm-up call too
        self.head_policy, self.head_ms = time_layouts(self.head_candidates, (1,), reps, run_head, before=step)
        return best

    def argmax(self, normed: torch.Tensor) -> torch.Tensor:
        """Final-norm states [..., H] -> the draft head's argmax [...] (draft-vocab ids; exact either way)."""
        if self.screen is not None and self.head_policy[1] == SCREENED:
            return self.screen.argmax(normed)
        return self.model.lm_head(normed).argmax(-1)

    def _set(self, policy: dict[int, str]) -> None:
        self.policy.clear()  # in place: every LayoutLinear holds this dict
        self.policy.update(policy)
