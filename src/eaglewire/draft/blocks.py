"""Many blocks of a block drafter in one forward: their positions, tokens and attention mask.

A block anchored at p is [x_p, MASK x (Bk-1)] at positions p..p+Bk-1. Laying N blocks side by side, each seeing
the context before its own anchor and its own Bk slots, is how the block objective (train/block.py) trains a
drafter and how the doctor (doctor/measured_block.py) scores one at many anchors: it belongs to the draft, below
both.
"""

from __future__ import annotations

import torch


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """anchors [B, N] -> [B, N*Bk] absolute positions p..p+Bk-1 of each block, blocks in anchor order."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[B, N*Bk] block tokens: slot 0 the anchor's token x_p, slots 1..Bk-1 the mask token."""
    B, N = anchors.shape
    ids = torch.full((B, N, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    return ids.flatten(1)


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[B, Q, S+Q] bool (True = may attend), Q = N*Bk, S = context_len: a query of block j sees context
    positions < anchor_j and the Bk keys of block j, nothing else."""
    B, N = anchors.shape
    q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [B, Q]
    ctx = torch.arange(context_len, device=anchors.device)[None, None, :] < q_anchor[:, :, None]  # [B, Q, S]
    blk = torch.arange(N * block_size, device=anchors.device) // block_size  # [Q] block index of each slot
    own = (blk[:, None] == blk[None, :]).expand(B, -1, -1)  # [B, Q, Q] block-diagonal
    return torch.cat([ctx, own], dim=2)
