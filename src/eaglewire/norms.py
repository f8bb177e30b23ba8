"""The draft's norm flags (the EAGLE-3.1 switches) and the named sets a draft is trained with.

Part of the wiring contract (contract.WiringContract.norm): an engine that does not apply a flag the draft was
trained with runs another function with no error.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.errors import ContractMismatch


@dataclass(frozen=True)
class NormFlags:
    """EAGLE-3.1 switches; all False is plain EAGLE-3 (what SGLang and vLLM assume when absent)."""

    norm_before_fc: bool = False  # one RMSNorm over the n*H concatenation before fc
    fc_norm: bool = False  # one RMSNorm per tap chunk before fc
    norm_output: bool = False  # feed the post-norm hidden (not pre-norm) to the next draft step
    norm_before_residual: bool = False  # residual taken after hidden_norm (speculators' default True)

    @property
    def on(self) -> frozenset[str]:
        """The names of the flags that are set."""
        return frozenset(k for k, v in self.__dict__.items() if v)

    def __post_init__(self) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ContractMismatch(
                "norm_before_fc and fc_norm are mutually exclusive",
                expected="at most one of them true",
                found="both true",
            )


# The norm sets a new draft can be trained with (`eaglewire train --norms`). Which engines serve each is the
# engine records' `norms` (export/engines.py); the doctor's norm_flags check holds an export to them.
NORM_PRESETS: dict[str, NormFlags] = {
    "eagle3": NormFlags(),  # EAGLE-3 as published: every engine serves it
    # EAGLE-3.1 ("attention drift"): an RMSNorm on each captured state, the post-norm state fed back
    "eagle3.1": NormFlags(fc_norm=True, norm_output=True),
    # speculators' eagle3 defaults: one RMSNorm over the concatenation, post-norm feedback, residual after norm
    "speculators": NormFlags(norm_before_fc=True, norm_output=True, norm_before_residual=True),
}


def norm_preset_name(norm: NormFlags) -> str | None:
    """The preset these flags are, or None for a set no preset names."""
    return next((name for name, flags in NORM_PRESETS.items() if flags == norm), None)
