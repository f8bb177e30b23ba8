"""Where a running engine loses acceptance, from its per-position counters (`doctor live`, doctor/live.py): the
conditional acceptance at each draft position (rounds accepted at i / rounds accepted at i-1), the positions
below our prediction beyond noise (a Wilson interval, doctor/expect.py), and what the pattern points at.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.doctor.counters import Counters
from eaglewire.doctor.expect import POS_MARGIN, wilson


@dataclass
class PositionFinding:
    position: int  # 0-based draft position
    measured: float  # conditional acceptance there: accepted at i / accepted at i-1 (rounds, for i = 0)
    interval: tuple[float, float]
    predicted: float


def conditional(per_position: list[float]) -> list[float]:
    """Acceptance at position i given the round reached it (prefix acceptance): p_i / p_(i-1), p_(-1) = 1."""
    prev, out = 1.0, []
    for p in per_position:
        out.append(p / prev if prev > 0 else 0.0)
        prev = p
    return out


def low_positions(counters: Counters, predicted: list[float]) -> list[PositionFinding]:
    """Draft positions whose conditional acceptance is below our prediction beyond noise: the upper end of its
    Wilson interval (over the rounds that reached that position) more than POS_MARGIN below."""
    pred_c, out = conditional(predicted), []
    reached = counters.drafts or 0.0
    for i, acc in enumerate(counters.accepted_per_pos[: len(pred_c)]):
        if reached <= 0:
            break
        rate = acc / reached
        lo, hi = wilson(rate, reached)
        if hi < pred_c[i] - POS_MARGIN:
            out.append(PositionFinding(i, rate, (lo, hi), pred_c[i]))
        reached = acc
    return out


def pointer(low: list[PositionFinding], draft: str, target: str | None, k: int) -> tuple[str, str]:
    """What the per-position pattern points at, and the doctor command to run next."""
    t = f" --target {target}" if target else ""
    if any(f.position == 0 for f in low):
        return (
            "the first draft position is lost: the draft does not get what it was trained on — taps (layer ids), "
            "fc / aux hidden states, the vocabulary map (d2t), embedding or lm_head replaced",
            f"eaglewire doctor check {draft}{t}   (then: eaglewire doctor dump-vllm {draft} --out d.safetensors; "
            f"eaglewire doctor probe --dump d.safetensors --contract {draft}{t})",
        )
    return (
        "the first position holds, later ones fall: the draft's recurrence differs from training — norm flags on "
        "the state fed back (norm_output / norm_before_residual), TTT depth trained shorter than the engine "
        "drafts, a block drafter's block layout",
        f"eaglewire doctor check {draft}{t} --num-speculative-tokens {k}",
    )
