"""Canonical taps (residual-stream boundaries, eaglewire.contract's numbering): what a valid tap list is, and the
default every engine lands on. No engine numbering here: contract.py translates, with its one off-by-one."""

from __future__ import annotations

from typing import Sequence

from eaglewire.errors import TranslationError


def default_taps(num_layers: int) -> tuple[int, ...]:
    """Boundaries [2, L//2, L-3]: the physical states every engine's default lands on.

    For shallow targets these collide and engines would silently capture fewer states; we refuse.
    """
    taps = (2, num_layers // 2, num_layers - 3)
    if not 0 < taps[0] < taps[1] < taps[2] < num_layers:
        raise TranslationError(
            f"the default taps [2, L//2, L-3] are not distinct and ascending for L={num_layers}",
            expected="a target with at least 8 decoder layers, or explicit taps",
            found=f"L={num_layers} gives boundaries {list(taps)}",
            fix="pass explicit taps, e.g. --taps 1,2,3 (boundaries, ascending)",
        )
    return taps


def validate_boundaries(taps: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Canonical taps must be non-empty, strictly ascending, and inside [0, L]."""
    taps = tuple(int(t) for t in taps)
    if not taps:
        raise TranslationError("empty tap list", expected="at least one boundary", found="[]")
    if any(b < 0 or b > num_layers for b in taps):
        raise TranslationError(
            "tap outside the residual stream",
            expected=f"boundaries in [0, {num_layers}] for a target with L={num_layers} layers",
            found=str(list(taps)),
            fix="boundary b = output of decoder layer b-1; b=0 is the embedding, b=L the last layer",
        )
    if any(a >= b for a, b in zip(taps, taps[1:])):
        raise TranslationError(
            "taps must be strictly ascending and distinct",
            expected="ascending order (every engine concatenates taps in layer order)",
            found=str(list(taps)),
            fix=f"use {sorted(set(taps))}; a draft trained on another order must be retrained",
        )
    return taps
