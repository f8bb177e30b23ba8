"""The geometry a draft config implies, against its weights: head counts, and every weight's shape against
the config (an engine builds its layers from the config and loads the file into them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglewire.contract import WiringContract
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.errors import EaglewireError
from eaglewire.export.base import read_contract
from eaglewire.safeio import about_file, read_json_object
from eaglewire.target.protocol import TargetInfo


def _f(what: str, why: str, fix: str) -> Finding:
    return Finding("error", "geometry", what, why, fix)


def geometry_findings(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    """Head counts, then each weight's shape against what an engine builds from the config."""
    lc = ins.layer_config
    H, heads, I = lc.get("hidden_size"), lc.get("num_attention_heads"), lc.get("intermediate_size")
    kv = lc.get("num_key_value_heads") or heads
    bad = {
        k: v
        for k, v in (
            ("hidden_size", H),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv),
            ("intermediate_size", I),
            ("head_dim", lc.get("head_dim")),
        )
        if v is not None and v <= 0
    }
    if bad or heads is None or H is None:
        what = ", ".join(f"{k} = {v}" for k, v in bad.items()) or "hidden_size or num_attention_heads is missing"
        return [
            _f(
                f"the config describes no attention layer: {what}",
                "an engine builds its layer from these "
                "numbers: it fails to start or builds a layer that does not match the weights",
                "re-export the draft; the config is damaged or hand-edited",
            )
        ]
    if heads % kv:
        return [
            _f(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                "grouped attention cannot share kv heads unevenly: engines refuse the config",
                "re-export the draft; the config is damaged or hand-edited",
            )
        ]
    hd = lc.get("head_dim") or H // heads
    out = []
    for key, shape in ins.shapes.items():
        want = _expected_shape(key, H, heads, kv, hd, I)
        if want is not None and tuple(shape) != want:
            out.append(
                _f(
                    f"{key} has shape {tuple(shape)}; the config implies {want}",
                    "the engine builds the layer from the config: loading fails, or a reshape reads the "
                    "weight in the wrong layout",
                    "re-export the draft; config and weights disagree",
                )
            )
    return out


def stated_by(directory: Path) -> tuple[Any, WiringContract | None]:
    """The hidden size a draft directory's config states and the wiring contract it carries (side file or
    native config), read without loading weights; (None, None) where the directory has no config."""
    cfg_path = Path(directory) / "config.json"
    if not cfg_path.is_file():
        return None, None  # the command's own loader names the missing file
    config = read_json_object(cfg_path, what="a draft config")
    native = config.get("format") == "eaglewire.draft/1"
    layer = (
        config.get("transformer_layer_config", config)
        if "speculators_model_type" in config
        else config.get("draft", config)
    )
    contract = read_contract(directory)
    if contract is None and native and isinstance(config.get("contract"), dict):
        with about_file(cfg_path):
            contract = WiringContract.from_dict(config["contract"])
    return (target_width(layer) if isinstance(layer, dict) else None), contract


def target_width(layer_config: dict[str, Any]) -> Any:
    """The target hidden size a draft config says it reads: `target_hidden_size` where the config has one
    (a draft may be narrower than its target), else its own hidden size (EAGLE-3 drafts match the target)."""
    return layer_config.get("target_hidden_size") or layer_config.get("hidden_size")


def require_default_target_fits(
    hidden_size: Any, contract: WiringContract | None, target: TargetInfo | None, *, target_given: bool, draft: str
) -> None:
    """Refuse to check a draft against the default (embedded) target when it was made for another model.

    Without --target every doctor command loads the embedded target; a foreign draft (an 8B one, say) then
    gets findings about the wrong model ("hidden size 4096 != 576") whose fixes send the user retraining,
    when the fix is to name the target. The evidence: the draft config's hidden size, and the target its
    wiring contract names (where it has one)."""
    if target_given:
        return
    found = []
    if hidden_size is not None and hidden_size != target.hidden_size:
        found.append(f"the draft reads hidden states {hidden_size} wide")
    if contract is not None and contract.target.config_sha256 != target.identity.config_sha256:
        t = contract.target
        found.append(
            f"its wiring contract names target {t.name!r} ({t.num_layers} layers, hidden size "
            f"{t.hidden_size}, vocab {t.vocab_size})"
        )
    if found:
        raise EaglewireError(
            f"{draft} was made for another target than the default {target.name!r}, and no --target was given",
            expected=f"a draft for the default target (hidden size {target.hidden_size}, {target.num_layers} "
            "layers), or --target",
            found="; ".join(found),
            fix="pass --target DIR: a local directory holding the config.json, tokenizer and weights of the "
            "model the draft is served with (a hub id is not downloaded)",
        )


_ATTN_OUT = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv"}


def _expected_shape(key: str, H: int, heads: int, kv: int, hd: int, I: int | None) -> tuple[int, ...] | None:
    """The shape a decoder-layer weight must have (None: not a layer weight, or one whose width depends on
    what the config does not say, e.g. layer 0's input width of two or more hidden sizes)."""
    parts = key.split(".")
    if len(parts) < 3 or parts[-1] != "weight":
        return None
    name = parts[-2]
    first = key.startswith(("midlayer.", "layers.0."))  # layer 0 reads [embed ; hidden]: 2H wide
    width = 2 * H if first else H
    if name in _ATTN_OUT:
        return ((heads if _ATTN_OUT[name] == "q" else kv) * hd, width)
    if name == "o_proj":
        return (H, heads * hd)
    if name in ("gate_proj", "up_proj") and I is not None:
        return (I, H)
    if name == "down_proj" and I is not None:
        return (H, I)
    if name in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        return (H,)
    return None
