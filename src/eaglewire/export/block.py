"""Block drafters' (DFlash) checkpoint formats: one record per format, written and read strictly.

The weights are z-lab's HF layout in every format (eaglewire.draft.dflash's state dict, key for key: no
embedding, no head, no d2t: the target's are used); a reduced-vocabulary draft adds lm_head, d2t and t2d and is
written as vllm only (vLLM's DFlash loader reads draft_vocab_size, lm_head and d2t; z-lab's and SGLang's
DFlash models have no head of their own). What differs is the config, read from each engine's code:

    zlab         DFlashDraftModel, model_type qwen3, top-level block_size / num_target_layers / layer_types,
                 dflash_config {mask_token_id, target_layer_ids}; id k = output of layer k (z-lab's reference
                 reads HF hidden_states[k+1]: the last layer's entry is post-norm, so boundary L is refused)
    sglang       the same config, with block_size and num_target_layers ALSO inside dflash_config (SGLang's
                 parse_dflash_draft_config reads dflash_config first); SGLang captures before layer k+1
    vllm         speculators' `dflash` config (speculators 0.9.0 DFlashSpeculatorConfig): transformer_layer_config
                 (a Qwen3 config), aux_hidden_state_layer_ids in vLLM's own numbering (vLLM's update_dflash
                 copies them as is to eagle_aux_hidden_state_layer_ids, which wins over every other field),
                 mask_token_id, block_size, sample_from_anchor false, and sliding_window_non_causal TRUE:
                 vLLM's update_dflash sets dflash_config.causal = not sliding_window_non_causal (default
                 True), and dflash_config.causal overrides EVERY layer (qwen3_dflash.py _dflash_layer_causal),
                 so speculators' own default (false) would make vLLM run the full-attention layers causal.

Every format writes rope_theta / rope_parameters and is_neox_style explicitly: vLLM's DFlash layer falls
back to rope_theta 1e6 (set_default_rope_theta) and both engines to neox when the config is silent.
Semantics a format cannot carry, or that eaglewire's DFlash does not compute, are refused on export and on
import (an engine would otherwise run another function): causal or sliding-window block layers, anchor-first
slots, a reduced vocabulary in z-lab's or SGLang's layout, and in a z-lab config an
eagle_aux_hidden_state_layer_ids (vLLM would let it win).

This module names each layout and writes it; export/block_import.py reads an export back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract, to_engine
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.errors import CheckpointError, ContractMismatch, EaglewireError
from eaglewire.export.base import cast_floats, write_dir
from eaglewire.export.block_formats import DFLASH_FORMATS, BlockFormat, block_format
from eaglewire.export.layouts import SPECULATORS_VERSION
from eaglewire.families import FULL, BlockWiring
from eaglewire.safeio import read_json_object

ZLAB_ARCH = "DFlashDraftModel"
SPECULATORS_ARCH = "DFlashSpeculator"
FAMILY_OF_ARCH = {ZLAB_ARCH: "dflash", SPECULATORS_ARCH: "dflash"}  # a config's architecture -> its family
# What names a speculators-layout config is `speculators_model_type` (vLLM's speculators loader keys on it and
# rewrites `architectures` itself, algos.py update_dflash); speculators 0.9.0's own save_pretrained writes its
# model class, DFlashDraftModel, z-lab's architecture name. Either architecture is read.
SPECULATORS_TYPE = "dflash"
SPECULATORS_ARCHS = ([SPECULATORS_ARCH], [ZLAB_ARCH])


def is_speculators_config(config: dict[str, Any]) -> bool:
    """A DFlash config in speculators' layout (its own writer's or eaglewire's vLLM export)."""
    return config.get("speculators_model_type") == SPECULATORS_TYPE and config.get("architectures") in SPECULATORS_ARCHS


# Block drafters of families eaglewire reads (the doctor) but does not compute: speculators_model_type or
# architecture -> family. Importing one is refused by name instead of failing in the EAGLE-3 reader.
FOREIGN_BLOCK = {
    "dspark": "dspark",
    "dflash2": "dflash2",
    "DFlash2DraftModel": "dflash2",
    "DSparkSpeculator": "dspark",
    "Qwen3DSparkModel": "dspark (DeepSpec)",
}


def foreign_block_family(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures")
    names = [config.get("speculators_model_type"), *(archs if isinstance(archs, list) else [])]
    return next((FOREIGN_BLOCK[n] for n in names if isinstance(n, str) and n in FOREIGN_BLOCK), None)


def block_family(config_path: Path) -> str | None:
    """The block-drafter family an export's config.json declares (by its architecture), None for any other
    config or none at all (the EAGLE-3 importers then report what is wrong)."""
    try:  # the one JSON reader (size, encoding, nesting depth, duplicate keys), not a bare json.loads
        archs = read_json_object(config_path, what="a draft config").get("architectures")
    except EaglewireError:
        return None
    found = (
        {FAMILY_OF_ARCH[a] for a in archs if isinstance(a, str) and a in FAMILY_OF_ARCH}
        if isinstance(archs, list)
        else set()
    )
    return found.pop() if len(found) == 1 else None


def block_layout(config: dict[str, Any], side: WiringContract | None = None) -> str:
    """Which DFlash format wrote an export's config.json: speculators' architecture says vLLM's; z-lab's and
    SGLang's share theirs, so the contract side file (`side`) decides by the convention whose ids the config
    holds (where both read the same ids, either reads it the same). No side file: z-lab's, the publisher's
    layout; another layout is then imported with `eaglewire import --format`."""
    if is_speculators_config(config):
        return "vllm"
    ids = config_at(config, DFLASH_FORMATS["zlab"].ids_at)
    if side is not None:
        for name in ("zlab", "sglang"):
            conv = DFLASH_FORMATS[name].convention
            if list(to_engine(side.taps, conv, side.target.num_layers)) == ids:
                return name
    return "zlab"


def refuse_unportable(block: BlockWiring, cfg: DraftConfig, fmt: str) -> None:
    """Refuse what format `fmt` cannot carry or eaglewire's DFlash does not compute (anchor-first slots, causal or
    sliding block layers, a reduced vocabulary outside vLLM's layout): on export and on import alike."""
    problems = []
    if block.anchor_layout != "bonus":
        problems.append(("anchor_layout", "bonus (slot k predicts p+k, as z-lab's DFlash)", block.anchor_layout))
    if block.causal or block.sliding_layers:
        problems.append(
            (
                "attention",
                "bidirectional full attention in every block layer",
                f"causal={block.causal}, sliding_layers={list(block.sliding_layers)}",
            )
        )
    if cfg.draft_vocab_size != cfg.vocab_size and fmt != "vllm":  # only vLLM's loader reads lm_head and d2t
        problems.append(
            (
                "vocabulary",
                f"the full vocabulary ({cfg.vocab_size}); a reduced one is written as vllm/speculators only",
                f"{cfg.draft_vocab_size}",
            )
        )
    if problems:
        raise CheckpointError(
            f"this DFlash draft cannot be written as {fmt}",
            expected="; ".join(f"{k}: {e}" for k, e, _ in problems),
            found="; ".join(f"{k}: {f}" for k, _, f in problems),
            fix="these engines' DFlash loaders would run a different function; retrain with "
            "the default block wiring (a reduced vocabulary: export as vllm)",
        )


def _qwen3_fields(cfg: DraftConfig, num_layers: int, dtype: str) -> dict[str, Any]:
    """A complete Qwen3 config for the draft's decoder layers (z-lab's drafts are Qwen3 layers: q/k norms)."""
    return {
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "layer_types": [FULL] * num_layers,
        "sliding_window": None,
        "use_sliding_window": False,
        "is_neox_style": True,
    }


def make_block_config(
    fmt: BlockFormat, cfg: DraftConfig, contract: WiringContract, dtype: str, verifier: str | None = None
) -> dict[str, Any]:
    block = contract.block
    assert block is not None
    ids = list(to_engine(contract.taps, fmt.convention, contract.target.num_layers))
    layer = _qwen3_fields(cfg, cfg.num_layers, dtype)
    if fmt.style == "speculators":
        return {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "dflash",
            "speculators_version": SPECULATORS_VERSION,
            "transformer_layer_config": layer,
            "draft_vocab_size": cfg.draft_vocab_size,
            "block_size": block.block_size,
            "target_hidden_size": cfg.target_hidden_size,
            "aux_hidden_state_layer_ids": ids,
            "mask_token_id": block.mask_token_id,
            "sliding_window_non_causal": True,
            "sample_from_anchor": False,
            "torch_dtype": dtype,
            "speculators_config": {
                "algorithm": "dflash",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block.drafts_per_round}],
                "verifier": {
                    "name_or_path": verifier or contract.target.name,
                    "architectures": [contract.target.architecture],
                },
            },
        }
    dflash: dict[str, Any] = {"mask_token_id": block.mask_token_id, "target_layer_ids": ids}
    if fmt.block_in_dflash_config:
        dflash.update(block_size=block.block_size, num_target_layers=contract.target.num_layers)
    return {
        **layer,
        "architectures": [ZLAB_ARCH],
        "block_size": block.block_size,
        "num_target_layers": contract.target.num_layers,
        "target_hidden_size": cfg.target_hidden_size,
        "dflash_config": dflash,
    }


def export_block_draft(
    draft: DFlashDraft,
    contract: WiringContract,
    out: Path,
    fmt_name: str,
    *,
    dtype: torch.dtype | None = None,
    verifier: str | None = None,
    force: bool = False,
    inputs: tuple[Path, ...] = (),
) -> Path:
    """Write a block drafter in format `fmt_name` (its family record's block_formats) plus the contract side file; an
    existing `out` must be an earlier export (or `force`) and never one of `inputs` (eaglewire.outputs)."""
    fmt = block_format(contract.family, fmt_name)
    block = contract.block
    if block is None or draft.contract.block != block:  # the draft's wiring is its own contract's
        raise ContractMismatch(
            "the contract given is not the draft's block wiring",
            expected=repr(draft.contract.block),
            found=repr(block),
            fix="export the draft with the contract it was trained with",
        )
    draft.cfg.require_matches(contract)
    refuse_unportable(block, draft.cfg, fmt.name)
    tensors = cast_floats(dict(draft.state_dict()), dtype)
    float_dtype = next(v.dtype for v in tensors.values() if v.is_floating_point())
    config = make_block_config(fmt, draft.cfg, contract, str(float_dtype).removeprefix("torch."), verifier)
    return write_dir(out, config, tensors, contract, force=force, inputs=inputs)


def config_at(config: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted path of a config ("dflash_config.target_layer_ids"), None where any step is missing."""
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node
