"""τ (the acceptance length): the one definition, in a base module, so the decoder, the server's counters,
the doctor and vLLM's counters read back all count it alike without importing each other."""

from __future__ import annotations

__all__ = ["acceptance_length"]


def acceptance_length(accepted_drafts: float, verify_steps: float) -> float:
    """tau: tokens a verify step yields on average, the accepted drafts plus the target's own (bonus)
    token; nan before any step. vLLM's mean acceptance length counts the bonus token too."""
    return (accepted_drafts + verify_steps) / verify_steps if verify_steps else float("nan")
