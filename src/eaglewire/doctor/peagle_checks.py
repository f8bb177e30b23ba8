"""P-EAGLE (parallel-drafting EAGLE-3, speculators_model_type "peagle") checks, appended to the EAGLE-3 ones
(checks.py CHECKS): a P-EAGLE draft is an EAGLE-3 draft plus a mask token and a learned `mask_hidden` that stands
in for the target's taps at every masked slot. Each fires only on a P-EAGLE config, so no EAGLE-3 verdict changes.

vLLM 0.32 (llama_eagle3.py load_weights, transformers_utils/configs/speculators/algos.py update_peagle): the
mask token is required (it becomes `pard_token`); with parallel drafting on, a checkpoint without `mask_hidden`
is refused; with it off, `mask_hidden` is skipped with a log warning and the draft runs as sequential EAGLE-3.
"""

from __future__ import annotations


from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.target.protocol import TargetInfo


def peagle(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if ins.config.get("speculators_model_type") != "peagle":
        return []
    out = []
    if not isinstance(ins.config.get("mask_token_id"), int):
        out.append(
            Finding(
                "error",
                "peagle",
                "a P-EAGLE config without mask_token_id",
                "vLLM's update_peagle reads it as the parallel-drafting token (pard_token) and fails without it",
                "write the mask token id the draft was trained with",
            )
        )
    taps = ins.config.get("eagle_aux_hidden_state_layer_ids")
    width = (
        ins.layer_config.get("target_hidden_size")
        or ins.config.get("target_hidden_size")
        or ins.layer_config.get("hidden_size")
    )
    shape = ins.shapes.get("mask_hidden")
    if shape is None:
        out.append(
            Finding(
                "error",
                "peagle",
                "a P-EAGLE draft without its mask_hidden weight",
                "vLLM 0.32 refuses it with parallel drafting on (llama_eagle3.py: 'mask_hidden not found "
                "in weights'); the masked slots have no learned stand-in for the target's taps",
                "export the trained mask_hidden with the draft",
            )
        )
    elif isinstance(taps, list) and isinstance(width, int) and _numel(shape) != len(taps) * width:
        out.append(
            Finding(
                "error",
                "peagle",
                f"mask_hidden has shape {list(shape)}, not {len(taps)} taps x {width}",
                "vLLM copies it into a [1, taps x hidden] buffer: another size fails to load",
                "export the mask_hidden of this draft",
            )
        )
    else:
        out.append(
            Finding(
                "info",
                "peagle",
                "a P-EAGLE draft: serve it with parallel drafting on",
                "without parallel_drafting in vLLM's speculative config, vLLM skips mask_hidden (a log "
                "warning) and drafts sequentially as EAGLE-3, at lower acceptance than trained",
                'vllm serve ... --speculative-config \'{"method": "eagle3", "parallel_drafting": true, ...}\'',
            )
        )
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
