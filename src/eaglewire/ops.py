"""The transformer ops the draft model and the target runtimes share: RMSNorm and rotate-half RoPE.

One definition each, written for decoding's per-op overhead: a 1-row decode step of a 30-layer target is
thousands of tiny ops around its GEMMs, and on a CPU each op's dispatch, not its arithmetic, is what it
costs, so these ops are written with as few calls as the arithmetic allows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm. For fp32 inference, torch's fused kernel (one op instead of seven; bit-identical to
    the op-by-op form on the embedded target's logits); otherwise HF's op order (fp32 statistics, the
    weight applied after rounding to the input dtype, which the fused kernel does not do), so training's
    autograd and the bf16 paths are exactly what they were."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and not torch.is_grad_enabled():
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [..., D] -> [-sin_first_half, sin_second_half], what `rotate` multiplies the rolled x by."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    """RoPE in HF's rotate-half convention, x * cos + cat(-x2, x1) * sin, for x [B, heads, T, D] and
    cos, ssin = signed_sin(sin) broadcastable to it. cat(-x2, x1) * sin == roll(x, D/2) * ssin exactly
    (only where the sign is applied moves): one op instead of four, per call."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * ssin


def rope_tables(
    position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Default-scaling RoPE tables for position_ids [B, T]: (cos, signed sin), each [B, 1, T, dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim))
    freqs = position_ids.float()[:, None, :, None] * inv_freq  # [B, 1, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), signed_sin(emb.sin().to(dtype))


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention through torch's fused kernel: q [B, Hq, T, D], keys and values
    [B, Hkv, S, D] (Hq a multiple of Hkv), mask additive [B or 1, 1, T, S] or None -> [B, Hq, T, D]."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


def unfused_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`sdpa`'s sum written as broadcast products and reductions (mask required), for a traced graph:
    inductor fuses it into a few loops where the fused kernel is an opaque call, which makes the graph's
    multi-row steps faster (compiled_body.py; for one row the fused kernel stays, no faster written out).
    Another summation order than the fused kernel's, so results differ from it in the last bits."""
    B, Hq, T, D = q.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    g = Hq // Hkv  # query heads per key/value head, adjacent in Hq (enable_gqa's grouping)
    qg = q.reshape(B, Hkv, g * T, D)
    scores = (qg[:, :, :, None, :] * keys[:, :, None]).sum(-1) * D**-0.5  # [B, Hkv, g*T, S]
    scores = scores.view(B, Hkv, g, T, S) + mask[:, :, None]  # mask [B or 1, 1, 1, T, S]
    p = torch.softmax(scores, dim=-1).view(B, Hkv, g * T, S, 1)
    return (p * values[:, :, None]).sum(-2).view(B, Hq, T, D)  # [B, Hkv, g*T, D] -> [B, Hq, T, D]
