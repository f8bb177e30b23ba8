"""The geometry a draft config implies, against its weights: head counts, and every weight's shape against
the config (an engine builds its layers from the config and loads the file into them).
"""

from __future__ import annotations

from typing import Any

from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection


def _f(what: str, why: str, fix: str) -> Finding:
    return Finding("error", "geometry", what, why, fix)


def geometry_findings(ins: Inspection, target: Any) -> list[Finding]:
    """Head counts, then each weight's shape against what an engine builds from the config."""
    lc = ins.layer_config
    H, heads, I = lc.get("hidden_size"), lc.get("num_attention_heads"), lc.get("intermediate_size")
    kv = lc.get("num_key_value_heads") or heads
    bad = {k: v for k, v in (("hidden_size", H), ("num_attention_heads", heads), ("num_key_value_heads", kv),
                             ("intermediate_size", I), ("head_dim", lc.get("head_dim"))) if v is not None and v <= 0}
    if bad or heads is None or H is None:
        what = ", ".join(f"{k} = {v}" for k, v in bad.items()) or "hidden_size or num_attention_heads is missing"
        return [_f(f"the config describes no attention layer: {what}", "an engine builds its layer from these "
                   "numbers: it fails to start or builds a layer that does not match the weights",
                   "re-export the draft; the config is damaged or hand-edited")]
    if heads % kv:
        return [_f(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                   "grouped attention cannot share kv heads unevenly: engines refuse the config",
                   "re-export the draft; the config is damaged or hand-edited")]
    hd = lc.get("head_dim") or H // heads
    out = []
    for key, shape in ins.shapes.items():
        want = _expected_shape(key, H, heads, kv, hd, I)
        if want is not None and tuple(shape) != want:
            out.append(_f(f"{key} has shape {tuple(shape)}; the config implies {want}",
                          "the engine builds the layer from the config: loading fails, or a reshape reads the "
                          "weight in the wrong layout", "re-export the draft; config and weights disagree"))
    return out


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
