"""The norm checks: the norm flags a draft was trained with (its contract, or its config without one) against the
norms the engine implements and the flags its config makes the engine apply. A norm applied that the weights never
saw, or skipped where they need it, runs another function with no error.
"""

from __future__ import annotations

from typing import Any

from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.target.protocol import TargetInfo


def norm_flags(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    trained = _trained_flags(ins)
    out = [
        Finding(
            "error",
            "norm_flags",
            f"the draft was trained with {flag} but {ins.engine.name} does not implement it",
            "the engine runs a different function with no error",
            "serve on vllm or retrain",
        )
        for flag, on in trained.items()
        if on and flag not in ins.engine.norms
    ]
    if ins.contract is not None:  # what the engine will apply, read from the config, against training
        out += _config_against_training(ins, trained)
    if ins.engine.norm_output_is_final_norm and ins.config.get("norm_output", True) is False:
        out.append(
            Finding(
                "error",
                "norm_flags",
                "norm_output: false in a config SpecForge reads",
                "SpecForge reads it as 'no final norm before lm_head' (SGLang: 'feed the pre-norm state "
                "back'), so an SGLang export warm-started in SpecForge is trained/scored without the final norm",
                "eaglewire export --format specforge (writes norm_output: true)",
            )
        )
    if ins.is_speculators:
        out += _speculators_flags(ins, trained)
    return out


def _trained_flags(ins: Inspection) -> dict[str, Any]:
    """{flag: on} the draft was trained with: its contract's, or (no contract) what its config says."""
    trained = (
        ins.contract.norm.__dict__
        if ins.contract
        else {k: bool(ins.config.get(k)) for k in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")}
    )
    if ins.contract is None and ins.engine.norm_output_is_final_norm:
        trained["norm_output"] = False  # SpecForge's norm_output is its final norm, not post-norm feedback
    return trained


def _config_against_training(ins: Inspection, trained: dict[str, Any]) -> list[Finding]:
    out = []
    for flag in sorted(ins.engine.norms):
        said = ins.config.get(flag)
        if ins.engine.norm_output_is_final_norm and flag == "norm_output":
            continue  # SpecForge's norm_output means the final norm: checked in norm_flags
        if said is not None and bool(said) != bool(trained[flag]):
            out.append(
                Finding(
                    "error",
                    "norm_flags",
                    f"config.json says {flag}: {bool(said)}, but the draft was "
                    f"trained with {flag}: {bool(trained[flag])}",
                    f"{ins.engine.name} applies what the "
                    "config says: a norm the weights never saw (or skips one they need), with no error",
                    "re-export from the native draft (eaglewire export writes the trained flags)",
                )
            )
    return out


def _speculators_flags(ins: Inspection, trained: dict[str, Any]) -> list[Finding]:
    """Where a speculators config (vLLM's) must spell a flag out: vLLM defaults some, and copies only some."""
    out = []
    if "norm_before_residual" not in ins.config:
        out.append(
            Finding(
                "error" if not trained.get("norm_before_residual") else "warn",
                "norm_flags",
                "norm_before_residual is absent from the speculators config",
                "vLLM's speculators path defaults it to True",
                "write it explicitly (eaglewire export does)",
            )
        )
    layer = ins.config.get("transformer_layer_config", {})
    for flag in ("fc_norm", "norm_output"):
        if trained.get(flag) and not layer.get(flag):
            out.append(
                Finding(
                    "warn",
                    "norm_flags",
                    f"{flag} is only at the top level of the speculators config",
                    "some vLLM versions copy only norm_before_fc/norm_before_residual from there",
                    f"also write {flag} inside transformer_layer_config (eaglewire export does)",
                )
            )
    return out
