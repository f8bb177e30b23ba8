"""Acceptance oracle: what tau SHOULD an engine measure with this draft, and is the measured one too low?

Our engine runs the same draft with the engine's exact knobs on the same prompts (greedy), which gives
the tau and per-position acceptance a correctly wired engine reaches (up to numerics and scheduling).
A measured tau is flagged when it falls below `RATIO` x predicted AND more than `MARGIN` below it:
    RATIO = 0.75, MARGIN = 0.25
(smaller gaps come from bf16 numerics, tree-building details and batch effects; a wiring fault drives
tau towards 1.0, far below both bounds). Probable causes are listed most-likely first.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RATIO, MARGIN = 0.75, 0.25
LOG_PATTERNS = {  # what the engines print per decode batch / periodically
    "sglang": re.compile(r"accept len:\s*([0-9.]+)"),
    "vllm": re.compile(r"Mean acceptance length:\s*([0-9.]+)"),
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


def parse_log(text: str) -> float | None:
    """Mean of every acceptance-length figure SGLang or vLLM printed in a log."""
    values = [float(m) for pat in LOG_PATTERNS.values() for m in pat.findall(text)]
    return statistics.mean(values) if values else None


def judge(predicted: float, per_position: list[float], measured: float | None) -> Expectation:
    if measured is None:
        return Expectation(predicted, per_position, None, False,
                           f"a correctly wired engine should measure tau ~ {predicted:.2f}", [])
    low = measured < RATIO * predicted and measured < predicted - MARGIN
    msg = (f"measured tau {measured:.2f} vs predicted {predicted:.2f}: "
           + ("far below the prediction — a wiring problem is likely" if low else "consistent with the prediction"))
    return Expectation(predicted, per_position, measured, low, msg, CAUSES if low else [])


def predict(target: Any, draft: Any, contract: Any, shape: Any, prompts: list[Any], max_new_tokens: int) -> tuple[float, list[float]]:
    """Run our engine with the engine's knobs on the prompts; tau and per-position acceptance."""
    from eaglewire.decoding.engine import SpecDecoder, SpecStats
    from eaglewire.decoding.hf_runtime import make_runtime
    from eaglewire.decoding.propose import EagleProposer

    max_len = max(p.shape[1] for p in prompts) + max_new_tokens + shape.num_draft_tokens + 16
    dec = SpecDecoder(make_runtime(target, max_len), EagleProposer(draft, contract, shape, max_len))
    eos = {target.tokenizer.eos_token_id} if target.tokenizer is not None else set()
    pooled = SpecStats()
    for ids in prompts:
        pooled.accepted += dec.generate(ids, max_new_tokens, eos)[1].accepted
    tau = pooled.tau if pooled.accepted else 0.0  # no verify step at all: nothing was predicted
    return tau, pooled.per_position(shape.num_steps)


def load_any_draft(path: Path, target: Any) -> tuple[Any, Any]:
    """A native checkpoint or any export (format detected the way the doctor does)."""
    import json

    from eaglewire.checkpoint import load_checkpoint
    from eaglewire.doctor.inspect import detect_engine
    from eaglewire.formats.convert import import_draft

    cfg = json.loads((Path(path) / "config.json").read_text())
    if cfg.get("format") == "eaglewire.draft/1":
        d = load_checkpoint(path, target=target)
        return d, d.contract
    return import_draft(path, detect_engine(cfg), target=target)
