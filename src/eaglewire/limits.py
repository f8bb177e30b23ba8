"""Every size read from a file is bounded before anything is allocated from it, and physics out of the range
where a model works is refused: the one table of limits the config readers (target, draft) check.

A config is untrusted: `num_hidden_layers: 1e9` would have transformers build a billion layers,
`intermediate_size: 1e12` allocate terabytes. Each field has a ceiling far above any released model, and the
weights a config implies are checked against the machine's memory, so a hostile or mistyped value is a
what/expected/found/fix error naming the field and the limit, not an allocation that never returns.
"""

from __future__ import annotations

import math
import os
from typing import Any

from eaglewire.errors import EaglewireError

# field -> largest accepted value (the largest released models are far below each)
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 1024,
    "num_layers": 1024,
    "hidden_size": 1 << 16,
    "target_hidden_size": 1 << 16,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "vocab_size": 1 << 22,
    "draft_vocab_size": 1 << 22,
    "num_taps": 64,
    "num_aux_hidden_states": 64,
    "max_position_embeddings": 1 << 24,
    "num_experts": 1 << 12,
    "num_local_experts": 1 << 12,
}
ZERO_OK = {"num_experts", "num_local_experts"}  # 0: a dense model
NONE_OK = {
    "head_dim",
    "num_key_value_heads",
    "max_position_embeddings",
    "num_experts",
    "num_local_experts",
    "moe_intermediate_size",
    "factor",
    "attention_factor",
}  # null: derived from other fields
# field -> (lowest, highest) where the arithmetic means what the model was trained with
PHYSICS: dict[str, tuple[float, float]] = {
    "rms_norm_eps": (1e-12, 1e-1),
    "layer_norm_eps": (1e-12, 1e-1),
    "layer_norm_epsilon": (1e-12, 1e-1),
    "rope_theta": (1.0, 1e10),
    "factor": (1e-3, 1e3),
    "attention_factor": (1e-3, 1e3),
}


def check_config_values(cfg: dict[str, Any], where: str, error: type[Exception] | None = None) -> None:
    """Refuse a size above SIZE_LIMITS or a number outside PHYSICS anywhere in `cfg` (nested configs:
    text_config, rope_scaling, rope_parameters), naming the field, its value and the limit."""
    for key, value, path in _leaves(cfg, ""):
        if key not in SIZE_LIMITS and key not in PHYSICS or value is None and key in NONE_OK:
            continue  # null where a config may write it: the model's default
        low = 0 if key in ZERO_OK else 1
        if key in SIZE_LIMITS and not (type(value) is int and low <= value <= SIZE_LIMITS[key]):
            raise (error or EaglewireError)(
                f"{where}: {path} is out of range",
                expected=f"an int from {low} to {SIZE_LIMITS[key]} (eaglewire.limits.SIZE_LIMITS[{key!r}])",
                found=f"{path} = {value!r}"[:200],
                fix="correct the config: the value is damage or a typo (no released model comes near)",
            )
        if key in PHYSICS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise (error or EaglewireError)(
                f"{where}: {path} is not a number",
                expected=f"{key}: a number",
                found=f"{path} = {value!r}"[:200],
                fix="restore the model's value",
            )
        if key in PHYSICS:
            lo, hi = PHYSICS[key]
            if not (math.isfinite(value) and lo <= value <= hi):
                raise (error or EaglewireError)(
                    f"{where}: {path} is outside the range where the model's arithmetic works",
                    expected=f"{lo:g} <= {key} <= {hi:g} (eaglewire.limits.PHYSICS[{key!r}])",
                    found=f"{path} = {value!r}",
                    fix="restore the value the model was trained with",
                )


def _leaves(obj: Any, prefix: str, depth: int = 0):
    if depth > 8 or not isinstance(obj, dict):
        return
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and k not in SIZE_LIMITS and k not in PHYSICS:  # a size given an object: refused
            yield from _leaves(v, path + ".", depth + 1)
        else:
            yield k, v, path


def check_weight_bytes(params: int, bytes_per: int, where: str, error: type[Exception] | None = None) -> None:
    """Refuse weights that cannot fit in this machine's memory, before allocating them."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    need = params * bytes_per
    if need > ram:
        raise (error or EaglewireError)(
            f"{where}: its sizes need more memory than this machine has",
            expected=f"weights of at most {ram / 2**30:.1f} GiB (the physical memory)",
            found=f"{params:,} parameters, {need / 2**30:.1f} GiB",
            fix="check the config's sizes (layers, widths, vocabulary): one of them is damaged or a typo",
        )


def estimated_params(cfg: dict[str, Any]) -> int:
    """A decoder-only model's parameter count from its config (embeddings, attention, MLP per layer)."""
    c = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

    def num(key: str, default: int = 0) -> int:
        v = c.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    h, layers, vocab = num("hidden_size"), num("num_hidden_layers"), num("vocab_size")
    inter = max(
        num("intermediate_size"), num("moe_intermediate_size") * max(num("num_experts"), num("num_local_experts"), 1)
    )
    return 2 * vocab * h + layers * (4 * h * h + 3 * h * inter)
