"""The target checks: the draft against the target it is served with (hidden size, rope and context length from the
target's config, the target its contract was trained for, the chat template it was trained with).
"""

from __future__ import annotations

from typing import Any

from eaglewire.capture.boundary_file import loaded
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.target.protocol import TargetInfo


def target_match(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if target is None:
        return []
    out, lc = [], ins.layer_config
    if lc.get("hidden_size") != target.hidden_size:
        out.append(
            Finding(
                "error",
                "target",
                f"draft hidden size {lc.get('hidden_size')} != target {target.hidden_size}",
                "the draft shares the target's embedding and reads its hidden states",
                "pass --target the model the draft was trained for, or train a draft for this target",
            )
        )
    if loaded(target):
        out += _config_match(lc, target.text_config)
    if ins.contract is not None:
        ident = target.identity
        if (
            ins.contract.target.config_sha256 != ident.config_sha256
            or ins.contract.target.num_layers != ident.num_layers
        ):
            out.append(
                Finding(
                    "error",
                    "target",
                    f"the draft was trained for {ins.contract.target.name!r} "
                    f"(config {ins.contract.target.config_sha256[:12]}), not this target "
                    f"({ident.config_sha256[:12]})",
                    "its taps describe another model's hidden states",
                    "use the target it was trained for, or train a draft for this one",
                )
            )
        tmpl = target.chat_template_sha256
        if ins.contract.chat_template_sha256 and tmpl != ins.contract.chat_template_sha256:
            out.append(
                Finding(
                    "error",
                    "chat_template",
                    "the target's chat template differs from the one the draft was trained with",
                    "the draft sees token contexts it never saw: acceptance drops",
                    "serve with the training template or retrain",
                )
            )
    return out


def _config_match(lc: dict[str, Any], tc: Any) -> list[Finding]:
    """The draft config's rope and context length against the target's config (a dump has no config)."""
    out = []
    rope = getattr(tc, "rope_parameters", None) or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(tc, "rope_theta", None)
    if theta is not None and lc.get("rope_theta") is not None and float(lc["rope_theta"]) != float(theta):
        out.append(
            Finding(
                "warn",
                "rope",
                f"draft rope_theta {lc['rope_theta']} != target {theta}",
                "positions are encoded differently from what the target uses",
                "check the draft config",
            )
        )
    if lc.get("rope_scaling"):
        out.append(
            Finding(
                "warn",
                "rope",
                f"draft config has rope_scaling {lc['rope_scaling']}",
                "the draft was trained without scaling; engines would apply it",
                "remove rope_scaling",
            )
        )
    tmax = getattr(tc, "max_position_embeddings", None)
    if tmax and lc.get("max_position_embeddings") and lc["max_position_embeddings"] < tmax:
        out.append(
            Finding(
                "warn",
                "max_positions",
                f"draft max_position_embeddings {lc['max_position_embeddings']} < target {tmax}",
                "some engines cap the usable context at the draft's",
                "raise it in the config",
            )
        )
    return out
