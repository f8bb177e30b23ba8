"""The draft's GEMMs on the lean runtime's layouts: a decoding copy of an Eagle3Draft whose Linears run as
`runtime.Linear` (oneDNN's prepacked weight where this torch and CPU offer it, else the fastest plain
matmul), everything else (norm flags, attention, RoPE) the draft's own tested code.

Why: drafting is a few 1-4 row GEMMs per round, and nn.Linear's layout is among the slowest here: with
nn.Linear a chain-k=3 round spent 17 ms drafting against 36 ms verifying (`eaglewire bench`, sitting-5
release, AMD EPYC with AVX512-BF16, fp32). Which layout wins differs by machine, row
count and dtype, so the copy measures it (`calibrate`, ~0.1 s) instead of assuming it. (The target's own
calibration here, fp32: a whole forward of 1 row 34 ms prepacked against 58 ms in nn.Linear's layout, of
4 rows 32 against 84.)
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from eaglewire.decoding.runtime import Linear, candidate_layouts
from eaglewire.draft.model import DraftCache, Eagle3Draft

DRAFT_ROWS, DRAFT_REPS = (1, 4), 5  # row counts timed (a draft step / an accepted run), repetitions each


class LayoutLinear(nn.Module):
    """nn.Linear's forward through `runtime.Linear`; the layout is looked up per row count in a policy
    {rows: layout} shared by every Linear of one draft (the largest rows key <= the call's rows)."""

    def __init__(self, lin: nn.Linear, policy: dict[int, str], packed: bool) -> None:
        super().__init__()
        self.lin, self.policy = Linear(lin.weight, lin.bias, packed), policy
        self.out_features = lin.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.numel() // x.shape[-1]
        return self.lin(x, self.policy[max(k for k in self.policy if k <= rows)])


class LeanDraft:
    """A decoding copy of `draft` (shares the target's embedding, not the caller's Linears) plus its
    layout policy. `model` is called exactly like the Eagle3Draft it copies."""

    def __init__(self, draft: Eagle3Draft, layout: str = "auto") -> None:
        dtype = draft.fc.weight.dtype
        self.candidates = candidate_layouts(dtype)
        if layout != "auto" and layout not in self.candidates:
            raise ValueError(f"layout {layout!r} is not available here (one of {self.candidates})")
        self.policy: dict[int, str] = {1: "tn", 2: "nt"} if layout == "auto" else {1: layout}
        emb = draft.embed_tokens.weight
        self.model = copy.deepcopy(draft, memo={id(emb): emb})  # the [V, H] embedding stays shared
        packed = "dnnl" in self.candidates
        for parent in list(self.model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LayoutLinear(child, self.policy, packed))
        self.model.eval()
        self.calibration_ms: dict[int, dict[str, float]] = {}
        if layout == "auto":
            self.calibrate()

    @torch.no_grad()
    def calibrate(self, rows: tuple[int, ...] = DRAFT_ROWS, reps: int = DRAFT_REPS) -> dict[int, str]:
        """Time a whole draft forward per layout and row count (layouts interleaved within each repetition,
        as the target's calibration does); keep the fastest per row count."""
        cfg, w = self.model.cfg, self.model.fc.lin.w
        cache = DraftCache(cfg, 1, 16 + max(rows), dtype=w.dtype, device=w.device)
        best: dict[int, str] = {}
        for r in rows:
            ids = torch.zeros(1, r, dtype=torch.long, device=w.device)
            taps = torch.zeros(1, r, cfg.num_taps * cfg.target_hidden_size, dtype=w.dtype, device=w.device)
            times: dict[str, list[float]] = {lay: [] for lay in self.candidates}
            for _ in range(reps):
                for lay in self.candidates:
                    self._set({1: lay})
                    t0 = time.perf_counter()
                    self.model(ids, taps, cache=cache, start=16)
                    times[lay].append(time.perf_counter() - t0)
            med = {lay: sorted(v)[len(v) // 2] for lay, v in times.items()}
            best[r] = min(med, key=med.get)
            self.calibration_ms[r] = {lay: t * 1e3 for lay, t in med.items()}
        self._set(best)
        return best

    def _set(self, policy: dict[int, str]) -> None:
        self.policy.clear()  # in place: every LayoutLinear holds this dict
        self.policy.update(policy)
