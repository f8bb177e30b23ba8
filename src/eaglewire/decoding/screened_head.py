"""The greedy token of an fp32 target, exact, through a bf16 copy of its head: half the bytes read.

Why: a decode step is memory-bound, and the head [V, H] is one of its largest reads (SmolLM2: 49,152 x 576,
113 MB of 540 in fp32; 5.6 ms of a 44 ms step on a 2-core AMD EPYC with AVX512-BF16, 2.9 ms for the same
product in bf16 through oneDNN's packed weight). Greedy decoding needs only the argmax, and the argmax
can be found exactly from a cheaper approximation plus a proof of how far off it can be.

The bound. The screen computes y_j = bf16 GEMM(bf16(w_j), bf16(h)): products of rounded inputs,
accumulated in fp32, the result rounded to bf16. With u = 2^-8 (bf16's unit roundoff) and n = H:
  - rounding w and h: |bf16(w) bf16(h) - w h| <= (2u + u^2) |w h| per product;
  - accumulating n products in fp32, here and in the fp32 product the answer must agree with:
    <= 2 gamma_n (1 + u)^2 sum_i |w_i h_i|, gamma_n = n 2^-24 / (1 - n 2^-24);
  - rounding y_j to bf16: <= u / (1 - u) |y_j|;
  - sum_i |w_ji h_i| <= ||w_j|| ||h|| (Cauchy-Schwarz; the row norms are computed once).
So e_j = c ||w_j|| ||h|| + u / (1 - u) |y_j| bounds |y_j - z_j| for the fp32 logit z_j. Token j can be
the argmax only if y_j + e_j >= max_k (y_k - e_k); those candidates are recomputed in fp32 and the first
largest wins, the tie rule of torch.argmax. On 357 states of real SmolLM2 decoding the bound was never
violated (largest error 0.20 against a smallest bound of 0.55), a state had a median of 2 candidates and
at most 37, and the bf16 argmax alone was wrong for 2% of them: the recompute is what makes it exact.

Sampling (temperature > 0) needs every logit: it keeps the fp32 head.
"""

from __future__ import annotations

import torch

from eaglewire.decoding.gemm import PACKED, Linear, candidate_layouts

U_BF16 = 2.0 ** -8  # bf16's unit roundoff: 8 significand bits, round to nearest
PLAIN, SCREENED = "plain", "screened"  # the greedy heads a runtime can calibrate between


def greedy_heads(dtype: torch.dtype) -> tuple[str, ...]:
    """The greedy heads worth timing for a runtime in `dtype`: the screen only for fp32 targets (a bf16 head
    already reads bf16) where oneDNN runs bf16 natively; an emulated bf16 GEMM would read the same bytes
    more slowly."""
    return (PLAIN, SCREENED) if dtype == torch.float32 and PACKED in candidate_layouts(torch.bfloat16) else (PLAIN,)


def screen_coefficient(hidden: int) -> float:
    """c in e_j = c ||w_j|| ||h|| + ...: the rounding of both inputs plus two fp32 accumulations of `hidden`
    products (the screen's and the reference's); see the module docstring."""
    gamma = hidden * 2.0 ** -24 / (1 - hidden * 2.0 ** -24)
    return 2 * U_BF16 + U_BF16 ** 2 + 2 * gamma * (1 + U_BF16) ** 2


class ScreenedHead:
    """argmax(h @ W.T) for an fp32 head W [V, H], read through a bf16 copy and an fp32 recompute of the few
    tokens the bf16 logits cannot rule out."""

    def __init__(self, weight: torch.Tensor, packed: bool) -> None:
        """packed: hold the bf16 copy as oneDNN's prepacked weight (where torch exposes it and the CPU runs
        bf16 natively: `gemm.candidate_layouts(torch.bfloat16)`), else as a plain bf16 matrix."""
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"a screened head needs an fp32 [V, H] weight, got {weight.dtype} "
                             f"{list(weight.shape)} (in bf16 the plain head already reads bf16)")
        self.w = weight.detach().contiguous()  # [V, H] fp32: the rows recomputed exactly
        self.lo = Linear(self.w.to(torch.bfloat16), None, packed)  # [V, H] bf16: the screen
        self.layout = PACKED if packed else "nt"
        self.row_norm = self.w.norm(dim=1)  # [V]
        self.c = screen_coefficient(self.w.shape[1])

    def candidates(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] fp32 -> bool [N, V]: the tokens that can still be each row's fp32 argmax."""
        y = self.lo(h.to(torch.bfloat16), self.layout).float()  # [N, V]
        err = (self.c * h.norm(dim=1, keepdim=True)) * self.row_norm + (U_BF16 / (1 - U_BF16)) * y.abs()
        floor = (y - err).amax(1, keepdim=True)  # [N, 1]: each row's largest logit is at least this
        return (y + err) >= floor

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> [...] token ids, equal to (h @ W.T).argmax(-1) computed in fp32."""
        flat = h.reshape(-1, h.shape[-1]).float()  # [N, H]
        if not bool(torch.isfinite(flat).all()):  # no bound holds for inf/nan: the plain product decides
            return (flat @ self.w.t()).argmax(-1).reshape(h.shape[:-1])
        cand = self.candidates(flat)  # [N, V]
        cols = cand.any(0).nonzero().squeeze(1)  # [C] ascending: every row's candidates, united
        exact = (flat @ self.w[cols].t()).masked_fill_(~cand[:, cols], float("-inf"))  # [N, C]
        return cols[exact.argmax(-1)].reshape(h.shape[:-1])
