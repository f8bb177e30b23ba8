"""The greedy token of an fp32 target through a bf16 copy of its head: an fp32 argmax at half the bytes.

Why: a decode step is memory-bound, and the head [V, H] is one of its largest reads (SmolLM2: 49,152 x 576,
113 MB of 540 in fp32), which a bf16 product through oneDNN's packed weight reads at half the bytes where
bf16 runs natively. Greedy decoding needs only the argmax, and the argmax can be found from a cheaper
approximation plus a bound on how far off it can be.

The bound. The screen computes y_j = bf16 GEMM(bf16(w_j), bf16(h)): products of rounded inputs (exact in
fp32), accumulated in fp32 with round-to-nearest (oneDNN's vdpbf16ps / tdpbf16ps), the result rounded to
bf16. With u = 2^-8 (bf16's unit roundoff), n = H and S_j = sum_i |w_ji h_i|:
  - rounding w and h: |bf16(w) bf16(h) - w h| <= (2u + u^2) |w h| per product;
  - accumulating in fp32, here and in any fp32 evaluation of the plain head (any order, FMA or not):
    <= 2 gamma_n (1 + u)^2 S_j, with gamma_n = n 2^-23 / (1 - n 2^-23) (2^-23 covers either rounding);
  - rounding y_j to bf16: <= u / (1 - u) |y_j|;
  - S_j <= ||w_j|| ||h|| (Cauchy-Schwarz; the row norms are computed once);
  - the bound itself is evaluated in fp32 (c carries a 2^-10 margin for that), and bf16 kernels flush
    denormals, an absolute error of at most (n + 2) 2^-126 (1 + ||w_j|| + ||h||) (UNDERFLOW).
So err_j = c ||w_j|| ||h|| + u / (1 - u) |y_j| + UNDERFLOW bounds |y_j - z_j| for every fp32 value z_j of
the logit. Token j can be the argmax only if y_j + err_j >= max_k (y_k - err_k): every token ruled out is
below a kept one under any fp32 evaluation. The screen tests a superset of that, y_j >= max y - 2 E with
E = max_j err_j (`ScreenedHead._thresholds`): a handful of scalar operations instead of a dozen passes over
the V logits, which would cost more than the bf16 GEMM saves. It keeps more tokens than the per-token test
would (tens rather than a few on a real head), each an H-wide fp32 row. The kept tokens are recomputed in
fp32 and the first largest wins, the tie rule of torch.argmax. That recompute is another fp32 GEMM than
the plain head's, so where two logits lie within fp32 accumulation error of each other
(~2 gamma_n ||w|| ||h||) it may pick the other one: the same latitude as choosing another fp32 GEMM
layout, never a bf16-quality answer (tests/fastcpu/test_screened_head.py: the bound covers the bf16 error at
every scale, the screen finds the fp32 argmax where bf16 alone does not, and greedy decoding through it
equals the plain head's).

Sampling (temperature > 0) needs every logit: it keeps the fp32 head.
"""

from __future__ import annotations

import math

import torch

from eaglewire.fastcpu.gemm import PACKED, candidate_layouts

U_BF16 = 2.0**-8  # bf16's unit roundoff: 8 significand bits, round to nearest
PLAIN, SCREENED = "plain", "screened"  # the greedy heads a runtime can calibrate between
# 2: one uniform threshold per row (was a per-token test); 3: the per-token test prunes a large uniform set.
# Bump when the screen's cost changes: cached calibrations (calibration.py keys on it) timed it
REVISION = 3
REFINE_ABOVE = 64  # kept tokens above which the per-token test prunes them before the fp32 recompute


def greedy_heads(dtype: torch.dtype) -> tuple[str, ...]:
    """The greedy heads worth timing for a runtime in `dtype`: the screen only for fp32 (a bf16 head
    already reads bf16) where oneDNN runs bf16 natively; an emulated bf16 GEMM would read the same bytes
    more slowly."""
    return (PLAIN, SCREENED) if dtype == torch.float32 and PACKED in candidate_layouts(torch.bfloat16) else (PLAIN,)


def default_head(heads: tuple[str, ...]) -> str:
    """The greedy head used before a calibration times them: the screen where it is offered."""
    return SCREENED if SCREENED in heads else PLAIN


def screen_coefficient(hidden: int) -> float:
    """c in err_j = c ||w_j|| ||h|| + ...: both inputs' rounding, two fp32 accumulations of `hidden`
    products (the screen's and the reference's), and a 2^-10 margin for evaluating the bound in fp32."""
    gamma = hidden * 2.0**-23 / (1 - hidden * 2.0**-23)
    return (2 * U_BF16 + U_BF16**2 + 2 * gamma * (1 + U_BF16) ** 2) * (1 + 2.0**-10)


class ScreenedHead:
    """argmax(h @ W.T) for an fp32 head W [V, H], read through a bf16 copy and an fp32 recompute of the few
    tokens the bf16 logits cannot rule out."""

    def __init__(self, weight: torch.Tensor, packed: bool) -> None:
        """packed: hold the bf16 copy as oneDNN's prepacked weight (where torch exposes it and the CPU runs
        bf16 natively: `gemm.candidate_layouts(torch.bfloat16)`), else as a plain bf16 matrix (tests)."""
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(
                f"a screened head needs an fp32 [V, H] weight, got {weight.dtype} "
                f"{list(weight.shape)} (in bf16 the plain head already reads bf16)"
            )
        self.w = weight.detach().contiguous()  # [V, H] fp32: the rows recomputed
        low = self.w.to(torch.bfloat16)  # [V, H] bf16: the screen (one copy, packed or plain)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(low, None) if packed else None
        self.low = None if packed else low
        self.row_norm = self.w.norm(dim=1)  # [V]
        self.max_row_norm = float(self.row_norm.max())
        n = self.w.shape[1]
        self.c = screen_coefficient(n)
        self.underflow_scale = (n + 2) * 2.0**-126

    def nbytes(self) -> int:
        """The memory this head holds beside the fp32 weight it shares: the bf16 copy and the row norms."""
        low = self.packed if self.packed is not None else self.low
        return low.numel() * low.element_size() + self.row_norm.numel() * self.row_norm.element_size()

    def screen(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] fp32 -> the bf16 logits [N, V], as fp32."""
        x = h.to(torch.bfloat16)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "").float()
        return (x @ self.low.t()).float()

    def candidates(self, h: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """h [N, H] fp32 (and its screen y [N, V] if computed) -> bool [N, V]: a superset of the tokens that can
        still be each row's fp32 argmax (None where a row is not finite: no bound holds there)."""
        y = self.screen(h) if y is None else y
        low, high = y.aminmax(dim=1)  # [N] each: one pass over the screen
        stats = torch.stack((low, high, h.norm(dim=1))).tolist()  # [3][N] floats: one copy out, not three
        thresholds = self._thresholds(*stats)
        if thresholds is None:
            return None
        return y >= torch.tensor(thresholds, dtype=y.dtype)[:, None]

    def _thresholds(self, low: list[float], high: list[float], hn: list[float]) -> list[float] | None:
        """Per row, a value every possible fp32 argmax's screened logit reaches: max_j y_j - 2 E, with
        E = c ||h|| max_j ||w_j|| + u / (1 - u) max_j |y_j| + UNDERFLOW >= err_j for every j (`bound`).
        Why uniform: the per-token test y_j + err_j >= max_k (y_k - err_k) keeps fewer tokens but costs a
        dozen passes over [N, V]; a decode step's screen is dominated by those small ops, not its GEMM, and
        a few more recomputed rows are cheap. It keeps a superset: err_j <= E and max_k (y_k - err_k) >=
        max y - E. Evaluated in float64 on Python floats; the slack 2^-20 (|y| + 2E) covers fp32 rounding of
        the screened logits' comparison. None if a row is not finite."""
        out = []
        for lo, hi, n in zip(low, high, hn):
            if not all(math.isfinite(v) for v in (lo, hi, n)):
                return None
            big = max(abs(lo), abs(hi))
            e = (
                self.c * n * self.max_row_norm
                + (U_BF16 / (1 - U_BF16)) * big
                + self.underflow_scale * (1 + n + self.max_row_norm)
            )
            out.append(hi - 2 * e - 2.0**-20 * (big + 2 * e))
        return out

    def bound(self, h: torch.Tensor, y: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """h [N, H], its screen y [N, V] -> err [N, V] >= |y - z| for every fp32 value z of h @ W.T; or, with
        cols [C], y [N, C] holding those columns' screen -> err [N, C]."""
        hn = h.norm(dim=1, keepdim=True)  # [N, 1]
        rn = self.row_norm if cols is None else self.row_norm[cols]  # [V] or [C]
        return (self.c * hn) * rn + (U_BF16 / (1 - U_BF16)) * y.abs() + self.underflow_scale * (1 + hn + rn)

    def _tight(self, h: torch.Tensor, y: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The per-token test over the uniform test's columns cols [C]: bool [N, C], y_j + err_j >= max_k
        (y_k - err_k). The max may be taken over cols alone: a token outside them has y_k < max y - 2 E, below
        the top token's y - err. Why: a flat distribution (a degenerate state) can pass thousands of tokens
        through the uniform test; this brings them back to the per-token test's few at [N, C] cost."""
        y_c = y[:, cols]  # [N, C]
        err = self.bound(h, y_c, cols)
        return (y_c + err) >= (y_c - err).amax(1, keepdim=True)

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> [...] token ids: an fp32 argmax of h @ W.T (see the module docstring)."""
        flat = h.reshape(-1, h.shape[-1])  # [N, H]
        flat = flat if flat.dtype == torch.float32 else flat.float()
        y = self.screen(flat)  # [N, V]
        cand = self.candidates(flat, y)  # [N, V] or None
        if cand is None:  # no bound holds for inf/nan (a broken state, or a bf16 overflow): the plain product
            return (flat @ self.w.t()).argmax(-1).reshape(h.shape[:-1])
        if cand.shape[0] == 1:  # a chain step or a decode step: every kept column is this row's
            cols = cand[0].nonzero().squeeze(1)  # [C] ascending
            if cols.numel() > REFINE_ABOVE:
                cols = cols[self._tight(flat, y, cols)[0]]
            return cols[(flat @ self.w[cols].t()).argmax(-1)].reshape(h.shape[:-1])
        cols = cand.any(0).nonzero().squeeze(1)  # [C] ascending: every row's candidates, united
        keep = cand[:, cols]  # [N, C]
        if cols.numel() > REFINE_ABOVE:
            keep = keep & self._tight(flat, y, cols)
            used = keep.any(0)
            cols, keep = cols[used], keep[:, used]
        exact = (flat @ self.w[cols].t()).masked_fill_(~keep, float("-inf"))  # [N, C]
        return cols[exact.argmax(-1)].reshape(h.shape[:-1])
