"""The doctor's reading of a draft config's numbers: each one's JSON type, checked before any check uses a
value, so a damaged or hand-edited config is an error naming the field rather than a crash or a wrong finding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglewire.errors import EaglewireError

INT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "num_hidden_layers",
    "max_position_embeddings",
    "num_aux_hidden_states",
)
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
        if node is not None and not (
            isinstance(node, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in node)
        ):
            raise _wrong(path, dotted, "a list of layer ids (integers)", node)


def _wrong(path: Path, field: str, expected: str, value: Any) -> EaglewireError:
    return EaglewireError(
        f"{path}: field {field!r} has the wrong JSON type",
        expected=f"{field}: {expected}",
        found=f"{field}: {value!r}"[:120] + f" ({type(value).__name__})",
        fix="re-export the draft (eaglewire export) or correct the field's type by hand",
    )
