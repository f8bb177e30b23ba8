"""Acceptance oracle: what tau SHOULD an engine measure with this draft, and is the measured one too low?

Our engine runs the same draft with the engine's exact knobs on the same prompts (greedy), which gives
the tau and per-position acceptance a correctly wired engine reaches (up to numerics and scheduling).
A measured tau is flagged when it falls below `RATIO` x predicted AND more than `MARGIN` below it:
    RATIO = 0.75, MARGIN = 0.25
(smaller gaps come from bf16 numerics, tree-building details and batch effects; a wiring fault drives
tau towards 1.0, far below both bounds). That rule alone misses faults of a weak draft: with tau 1.30
predicted, the embedding tap measured 1.10 in real vLLM. So when the engine's counts are known (vLLM logs
"Accepted / Drafted tokens" and the per-position rates; its /metrics has them too), the first draft
position is judged as a proportion over the drafts: flagged when the upper end of its `LEVEL` Wilson
interval lies more than `POS_MARGIN` below our predicted first-position acceptance. A healthy vLLM export
measures within 0.01 of our engine there (tests/vllm_client/test_vllm_client.py), and the interval shrinks with
every draft, so a longer log sharpens the verdict instead of flagging noise.
Probable causes are listed most-likely first.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from eaglewire.tau import named_tau

if TYPE_CHECKING:  # annotations only: the target is loaded by the caller
    from eaglewire.target.loader import Target
    from eaglewire.target.protocol import TargetInfo

RATIO, MARGIN = 0.75, 0.25
LEVEL, POS_MARGIN = 0.99, 0.05
Z = {0.95: 1.959964, 0.99: 2.575829}[LEVEL]
VLLM_COUNTS = re.compile(r"Drafted: (\d+) tokens, Per-position acceptance rate: ([0-9., ]+?), Avg")
# llama-server, when a request ends (tools/server/server-context.cpp, print_timings): "draft acceptance = R
# (A accepted / G generated), mean len = X" at the default verbosity, then "acc per pos = (r0, r1, ...)" (rates
# over the request's verification steps) at -lv 4 only. Its rounds draft fewer than k tokens near the end of a
# request (measured: 272 drafted in 93 rounds at k = 3), so rounds = A / sum(r), not G / k; G / k only where
# nothing was accepted
LLAMACPP_COUNTS = re.compile(
    r"\(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*[0-9.]+[^\n]*\n"
    r"[^\n]*acc per pos = \(([0-9., ]+)\)"
)
LOG_PATTERNS = {  # what the engines print per decode batch / periodically / per request
    "sglang": re.compile(r"accept len:\s*([0-9.]+)"),
    "vllm": re.compile(r"Mean acceptance length:\s*([0-9.]+)"),
    "llamacpp": re.compile(r"generated\), mean len =\s*([0-9.]+)"),
}
CAUSES = [
    "layer ids / taps: the engine feeds other layers than training (eaglewire doctor; doctor probe)",
    "aux capture off or fc skipped: one hidden state instead of the concatenated taps (doctor probe)",
    "embedding or lm_head replaced by the engine (tie_word_embeddings, draft_vocab_size null, missing keys)",
    "vocab map: d2t missing or absolute ids (eaglewire doctor)",
    "chat template or system prompt differs from training",
    "norm flags (norm_before_fc / fc_norm / norm_output / norm_before_residual) not applied by the engine",
    "sampling at temperature > 0 with strict verification (compare at temperature 0)",
]


@dataclass
class Expectation:
    predicted_tau: float
    per_position: list[float]
    measured_tau: float | None
    flagged: bool
    message: str
    causes: list[str]
    measured_first: tuple[float, float, float] | None = None  # first-position acceptance, LEVEL interval
    drafts: float | None = None


@dataclass
class Counts:
    """An engine's speculative counters: drafting rounds and tokens accepted at each draft position."""

    drafts: float
    accepted_per_position: list[float]

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts for a in self.accepted_per_position]


def parse_log_counts(text: str) -> Counts | None:
    """vLLM's per-interval SpecDecoding lines (drafts = drafted tokens / k per interval), or llama-server's
    per-request lines at -lv 4 (drafts = accepted / the sum of its rates: LLAMACPP_COUNTS), pooled."""
    rounds = [(int(drafted) / len(r), r) for drafted, r in ((d, _rates(x)) for d, x in VLLM_COUNTS.findall(text))]
    for accepted, drafted, rates in LLAMACPP_COUNTS.findall(text):
        r = _rates(rates)
        rounds.append((int(accepted) / sum(r) if sum(r) > 0 else int(drafted) / len(r), r))
    drafts, acc = 0.0, []
    for d, r in rounds:
        acc = [a + p * d for a, p in zip(acc, r)] if acc else [p * d for p in r]
        drafts += d
    return Counts(drafts, acc) if drafts else None


def _rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def wilson(p: float, n: float) -> tuple[float, float]:
    """The LEVEL Wilson score interval of a proportion p over n trials."""
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * (p * (1 - p) / n + Z * Z / (4 * n * n)) ** 0.5 / (1 + Z * Z / n)
    return centre - half, centre + half


def parse_log(text: str) -> float | None:
    """Mean of every acceptance-length figure SGLang or vLLM printed in a log."""
    values = [float(m) for pat in LOG_PATTERNS.values() for m in pat.findall(text)]
    return statistics.mean(values) if values else None


def judge(
    predicted: float, per_position: list[float], measured: float | None, counts: Counts | None = None
) -> Expectation:
    """The verdict (module docstring). `counts`: the engine's own counters, for the first-position rule."""
    if measured is None and counts is not None:
        from eaglewire.tau import acceptance_length

        measured = acceptance_length(sum(counts.accepted_per_position), counts.drafts)
    if measured is None:
        return Expectation(
            predicted,
            per_position,
            None,
            False,
            f"a correctly wired engine should measure {named_tau('expect', predicted)}",
            [],
        )
    low = measured < RATIO * predicted and measured < predicted - MARGIN
    msg = f"the engine's measured tau {measured:.2f} vs {named_tau('expect', predicted)} predicted"
    first = None
    if counts is not None and per_position:
        p = counts.per_position[0]
        lo, hi = wilson(p, counts.drafts)
        first = (p, lo, hi)
        pos_low = hi < per_position[0] - POS_MARGIN
        msg += (
            f"; first-position acceptance {p:.3f} [{lo:.3f}, {hi:.3f}] at {LEVEL:.0%} over "
            f"{counts.drafts:.0f} drafts vs predicted {per_position[0]:.3f}"
            + (" (below by more than the margin)" if pos_low else "")
        )
        low = low or pos_low
    msg += ": " + ("far below the prediction — a wiring problem is likely" if low else "consistent with the prediction")
    return Expectation(
        predicted, per_position, measured, low, msg, CAUSES if low else [], first, counts.drafts if counts else None
    )


def predict(
    target: Target,
    draft: Any,
    contract: Any,
    shape: Any,
    prompts: list[Any],
    max_new_tokens: int,
    progress: Callable[[str], None] = lambda phase: None,
) -> tuple[float, list[float]]:
    """Run our engine with the engine's knobs on the prompts; tau and per-position acceptance. `progress`
    hears each prompt as it starts (a prompt is seconds to a minute on a CPU)."""
    from eaglewire.compose import measure_tau
    from eaglewire.decoding.engine import SpecStats

    pooled = SpecStats()
    for i, ids in enumerate(prompts):
        progress(f"prompt {i + 1}/{len(prompts)} ({int(ids.shape[1])} tokens), {max_new_tokens} new tokens")
        pooled.accepted += measure_tau(target, draft, [ids], shape, max_new_tokens, contract=contract).accepted
    tau = pooled.tau if pooled.accepted else 0.0  # no verify step at all: nothing was predicted
    return tau, pooled.per_position(shape.num_steps)


def rule_applied(path: Path, target: TargetInfo, engine_version: str | None = None) -> str:
    """Which engine rule read the export's layer ids ("SGLang 0.5.23 llama.py (sglang-plus1)"), "" if none."""
    from eaglewire.export.convert import detect_engine
    from eaglewire.export.engines import engine_for
    from eaglewire.safeio import read_json_object

    cfg = read_json_object(Path(path) / "config.json", what="a draft config")
    if cfg.get("format") == "eaglewire.draft/1":
        return ""
    from eaglewire.doctor.block_inspect import block_layout, engine_rule

    block = block_layout(cfg)
    if block is not None:  # a block drafter: the doctor's block rules (the layout names the engine it is for)
        engine = "sglang" if block[1] == "sglang" else "vllm"
        version, _ = engine_rule(engine, engine_version if engine == "sglang" else None)
        return f"{engine} {version} ({block[0]} draft, {block[1]} layout)"
    return engine_for(detect_engine(cfg), engine_version).rule_note(target.identity.architecture)
