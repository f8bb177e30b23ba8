"""`eaglewire doctor watch`: an alarm when speculation stops paying on a live server.

Every `interval` seconds it reads the server's speculative counters (doctor/counters.py) and judges the
window since the previous reading: tau over that window only (deltas), against
    alarm_tau = max(--min-tau, break-even tau)
A window with fewer than `min_drafts` rounds is reported as quiet and judged with the next one (a few rounds
say nothing). Bounded: `iterations` readings at most (and a caller's `--duration`).

Break-even tau (the speed at which speculative decoding is no faster than plain decoding). Plain decoding
yields one token per target step of t_plain seconds. A speculative round drafts k tokens and verifies them in
one target forward: t_round = t_draft(k) + t_verify(k), and yields tau tokens on average (the accepted
drafts plus the target's bonus token). Speculation is faster iff tau / t_round > 1 / t_plain, so
    break-even tau = t_round / t_plain = round_cost
the cost of one speculative round in plain target steps. It is a measured figure, never assumed: the draft's
forwards, the wider verify forward and the engine's bookkeeping all count. `doctor live --plain-url` measures
it (decode time per round on the speculative server over decode time per token on a plain one, both from
streamed answers to the same prompts, prefill excluded: the first token's arrival is the start); `eaglewire
bench` gives it as eagle_chain's s per round over vanilla's s per token. Batch size changes it (a verify
forward of k+1 tokens per sequence costs relatively more when the target is compute-bound), so measure at
the batch the server runs at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from eaglewire.doctor.counters import Counters
from eaglewire.errors import EaglewireError

MIN_DRAFTS = 20  # rounds a window needs before its tau is judged


def break_even_tau(round_s: float, plain_token_s: float) -> float:
    """tau at which a speculative round's tokens take as long as plain decoding's (module docstring)."""
    if round_s <= 0 or plain_token_s <= 0:
        raise EaglewireError(
            "break-even tau needs two positive times",
            expected="seconds per round and per plain token",
            found=f"{round_s}, {plain_token_s}",
        )
    return round_s / plain_token_s


@dataclass
class Reading:
    at_s: float  # since the watch started
    drafts: float | None
    tau: float | None
    per_position: list[float]
    state: str  # ok / alarm / quiet / no_counters
    why: str = ""


@dataclass
class WatchReport:
    alarm_tau: float
    readings: list[Reading] = field(default_factory=list)

    @property
    def alarmed(self) -> bool:
        return any(r.state in ("alarm", "no_counters") for r in self.readings)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"alarm_tau": self.alarm_tau, "alarmed": self.alarmed, "readings": [asdict(r) for r in self.readings]}


def judge_window(window: Counters, alarm_tau: float, min_drafts: int = MIN_DRAFTS) -> tuple[str, str]:
    """(state, why) for one window of counters."""
    if not window.exposed:
        return "no_counters", "the engine exposes no speculative counters"
    if window.gauge_only:  # SGLang: its own interval's mean, no round count
        tau = window.tau
        return ("alarm", f"tau {tau:.2f} < {alarm_tau:.2f}") if tau < alarm_tau else ("ok", f"tau {tau:.2f}")
    if (window.drafts or 0) < min_drafts:
        return "quiet", f"{window.drafts or 0:.0f} rounds in the window (< {min_drafts}): judged with the next"
    tau = window.tau
    return (
        ("alarm", f"tau {tau:.2f} < {alarm_tau:.2f} over {window.drafts:.0f} rounds")
        if tau < alarm_tau
        else ("ok", f"tau {tau:.2f} over {window.drafts:.0f} rounds")
    )


def watch(
    read: Callable[[], Counters],
    alarm_tau: float,
    interval_s: float,
    iterations: int,
    min_drafts: int = MIN_DRAFTS,
    one_shot: bool = False,
    on_reading: Callable[[Reading], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchReport:
    """Poll `read` `iterations` times (the first reading is the baseline); a quiet window is carried into the
    next. one_shot: stop at the first alarm."""
    if iterations < 1 or interval_s < 0:
        raise EaglewireError(
            "watch needs iterations >= 1 and interval >= 0",
            expected="bounded polling",
            found=f"iterations={iterations}, interval={interval_s}",
        )
    report, t0 = WatchReport(alarm_tau), time.perf_counter()
    base = read()
    for _ in range(iterations):  # bounded
        sleep(interval_s)
        now = read()
        window = now.minus(base)
        state, why = judge_window(window, alarm_tau, min_drafts)
        r = Reading(round(time.perf_counter() - t0, 3), window.drafts, window.tau, window.per_position, state, why)
        report.readings.append(r)
        if on_reading:
            on_reading(r)
        if state != "quiet":
            base = now  # the next window starts here; a quiet one keeps accumulating
        if one_shot and state in ("alarm", "no_counters"):
            break
    return report
