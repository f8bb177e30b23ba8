"""τ (the acceptance length): the one definition, in a base module, so the decoder, the server's counters,
the doctor and vLLM's counters read back all count it alike without importing each other."""

from __future__ import annotations

__all__ = ["TAU_KINDS", "acceptance_length", "named_tau"]

# The five τ a user meets for one draft, each measured another way (docs/guides/glossary.md, "Why the τ differ"):
# every printed τ names its kind, so two figures are never compared as if they were one.
TAU_KINDS = {
    "teacher-forced": "training's held-out score: every draft position fed the target's true states, no drafted "
    "token fed back; the training data's own turns (the most optimistic figure)",
    "doctor's engine": "`eaglewire doctor`'s measurement: our decoder, free-running, on its few built-in prompts "
    "with short answers, at the shape of the engine's knobs",
    "expect": "`doctor expect`'s prediction: our decoder on --questions (first turns), --max-new-tokens each, at "
    "the engine's shape",
    "bench": "the benchmark's (a run's report, `eaglewire bench`): our decoder on the benchmark prompts at its "
    "answer length and shape",
    "live": "a running engine's own counters over the requests of one probe (`doctor live`, `doctor watch`)",
}


def named_tau(kind: str, value: float, digits: int = 2) -> str:
    """'tau (KIND) 1.95': a printed τ with what it is (one of TAU_KINDS)."""
    if kind not in TAU_KINDS:
        raise ValueError(f"tau kind must be one of {', '.join(TAU_KINDS)}, not {kind!r}")
    return f"tau ({kind}) {value:.{digits}f}"


def acceptance_length(accepted_drafts: float, verify_steps: float) -> float:
    """tau: tokens a verify step yields on average, the accepted drafts plus the target's own (bonus)
    token; nan before any step. vLLM's mean acceptance length counts the bonus token too."""
    return (accepted_drafts + verify_steps) / verify_steps if verify_steps else float("nan")
