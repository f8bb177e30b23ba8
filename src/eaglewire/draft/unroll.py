"""The draft unrolled on its own states, as training-time test runs it and as the doctor scores a draft:
the token stream shifted k steps, and the attention mask of step k (eaglewire.train.ttt's notation).
Here, with the draft, so that reading a draft (the doctor) does not import its trainer."""

from __future__ import annotations

import torch


def shift_left(x: torch.Tensor, k: int, fill: float | int | bool = 0) -> torch.Tensor:
    """x[:, k:] padded at the end with `fill` back to length T (dim 1)."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def ttt_attention_mask(T: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """bool [1, 1, T, (step+1)*T]: block 0 causal (j <= t), blocks 1..step diagonal (j == t)."""
    if step == 0:
        return None  # plain causal
    idx = torch.arange(T, device=device)
    blocks = [idx[None, :] <= idx[:, None]] + [torch.eye(T, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, dim=1)[None, None]
