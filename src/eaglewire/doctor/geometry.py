"""The doctor's reading of a draft config's numbers: their JSON types (a damaged or hand-edited config is an
error naming the field, before any check uses a value) and the geometry they imply (head counts, and every
weight's shape against the config: an engine builds its layers from the config and loads the file into them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.doctor.findings import Finding
from eaglewire.errors import EaglewireError

if TYPE_CHECKING:
    from eaglewire.doctor.inspect import Inspection

INT_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "vocab_size", "draft_vocab_size", "target_hidden_size", "num_hidden_layers",
              "max_position_embeddings", "num_aux_hidden_states")
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
NESTED = ("draft", "transformer_layer_config")  # a native config's draft, speculators' layer config
OBJECTS = ("eagle_config", "contract")  # SGLang's layer-id holder, a native config's contract


def check_config_types(config: dict[str, Any], path: Path, id_keys: tuple[str, ...]) -> None:
    """Raise naming the field when a number is not a JSON number (null: absent), a nested config is not an
    object, or a layer-id list is not a list of ints."""
    levels = [("", config)]
    for key in NESTED:
        if key in config:
            if not isinstance(config[key], dict):
                raise _wrong(path, key, "a JSON object", config[key])
            levels.append((f"{key}.", config[key]))
    for key in OBJECTS:
        if key in config and not isinstance(config[key], dict):
            raise _wrong(path, key, "a JSON object", config[key])
    for prefix, level in levels:
        for key in INT_FIELDS + FLOAT_FIELDS:
            v = level.get(key)
            ok = v is None or (not isinstance(v, bool) and isinstance(v, int if key in INT_FIELDS else (int, float)))
            if not ok:
                raise _wrong(path, prefix + key, "an integer" if key in INT_FIELDS else "a number", v)
    for dotted in id_keys:
        node: Any = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and not (isinstance(node, list) and
                                     all(isinstance(i, int) and not isinstance(i, bool) for i in node)):
            raise _wrong(path, dotted, "a list of layer ids (integers)", node)


def _wrong(path: Path, field: str, expected: str, value: Any) -> EaglewireError:
    return EaglewireError(f"{path}: field {field!r} has the wrong JSON type", expected=f"{field}: {expected}",
                          found=f"{field}: {value!r}"[:120] + f" ({type(value).__name__})",
                          fix="re-export the draft (eaglewire export) or correct the field's type by hand")


def _f(what: str, why: str, fix: str) -> Finding:
    return Finding("error", "geometry", what, why, fix)


def geometry_findings(ins: "Inspection", target: Any) -> list[Finding]:
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
