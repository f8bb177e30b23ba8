"""The probe's dump taken through real vLLM: what vLLM delivers to a draft exported for it.

`doctor dump-vllm` writes it; `doctor probe` then names the boundary of every delivered state. The
states are captured through vLLM's own extraction path (capture/vllm.py), at the ids the export's config
gives vLLM, so a miswired export shows here exactly as vLLM would feed it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from eaglewire.capture.vllm import capture_through_vllm
from eaglewire.doctor.tap_checks import engine_ids
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.errors import EaglewireError
from eaglewire.safeio import atomic_save_safetensors
from eaglewire.vllm_client.server import VLLM_VERSION

DUMP_FORMAT = "eaglewire.vllm-hidden-states/1"


def export_layer_ids(export_dir: Path) -> list[int]:
    """The ids vLLM reads from a draft directory's config.json (top-level key, else eagle_config's)."""
    ids, _key, _others = engine_ids(inspect_dir(export_dir, "vllm"))
    if not ids:
        raise EaglewireError(
            f"{export_dir}/config.json has no layer ids vLLM reads",
            expected="eagle_aux_hidden_state_layer_ids (or eagle_config.…)",
            found="none: vLLM would tap its model's default layers",
            fix="pass the ids explicitly (--layer-ids)",
        )
    return ids


def dump_through_vllm(
    target_dir: str | Path,
    prompt: list[int],
    out: Path,
    *,
    export_dir: Path | None = None,
    layer_ids: Sequence[int] | None = None,
    dtype: str = "float32",
) -> list[int]:
    """Write the probe dump (`hidden` [T, n*H], `input_ids` [T]) of what vLLM delivers to a draft exported
    for it: the ids in `export_dir`'s config (or `layer_ids`), concatenated in vLLM's (ascending) order.
    Returns the ids as vLLM uses them."""
    if layer_ids is None:
        if export_dir is None:
            raise EaglewireError("no layer ids to capture", expected="export_dir or layer_ids", found="neither")
        layer_ids = export_layer_ids(export_dir)
    ids = sorted(set(layer_ids))
    hs = capture_through_vllm(target_dir, [prompt], ids, dtype)[0]
    meta = {"format": DUMP_FORMAT, "engine": f"vllm {VLLM_VERSION}", "layer_ids": json.dumps(ids), "dtype": dtype}
    atomic_save_safetensors(
        {"hidden": hs.reshape(hs.shape[0], -1).contiguous(), "input_ids": torch.tensor(prompt, dtype=torch.long)},
        Path(out),
        metadata=meta,
    )
    return ids
