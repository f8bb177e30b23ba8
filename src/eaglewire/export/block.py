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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from eaglewire.target.protocol import TargetInfo
from eaglewire.contract import WiringContract, from_engine, renumber, to_engine
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.load import _check_keys, _check_tensor, _float_dtype, check_vocab_tensors, vocab_from_tensors
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import CheckpointError, ContractMismatch, EaglewireError
from eaglewire.export.base import WEIGHTS, cast_floats, read_contract, read_draft_config, read_safetensors, write_dir
from eaglewire.export.block_formats import DFLASH_FORMATS, BlockFormat, block_format
from eaglewire.export.layouts import SPECULATORS_VERSION, _rope_theta
from eaglewire.families import FULL, BlockWiring
from eaglewire.safeio import field_of, read_json_object, require_finite

ZLAB_ARCH = "DFlashDraftModel"
SPECULATORS_ARCH = "DFlashSpeculator"
# dflash_config fields eaglewire reads; any other one (use_swa, attention_sink_bias, causal, ...) changes what
# the engine computes and is refused on import
_DFLASH_CONFIG_KEYS = frozenset({"mask_token_id", "target_layer_ids", "block_size", "num_target_layers"})


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
    ids = _path(config, DFLASH_FORMATS["zlab"].ids_at)
    if side is not None:
        for name in ("zlab", "sglang"):
            conv = DFLASH_FORMATS[name].convention
            if list(to_engine(side.taps, conv, side.target.num_layers)) == ids:
                return name
    return "zlab"


def _refuse_unportable(block: BlockWiring, cfg: DraftConfig, fmt: str) -> None:
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
    _refuse_unportable(block, draft.cfg, fmt.name)
    tensors = cast_floats(dict(draft.state_dict()), dtype)
    float_dtype = next(v.dtype for v in tensors.values() if v.is_floating_point())
    config = make_block_config(fmt, draft.cfg, contract, str(float_dtype).removeprefix("torch."), verifier)
    return write_dir(out, config, tensors, contract, force=force, inputs=inputs)


# ---- import ---------------------------------------------------------------------------------------------


def _path(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _refuse_semantics(fmt: BlockFormat, config: dict[str, Any], layer: dict[str, Any], where: str) -> None:
    """Fields that make an engine compute something eaglewire's DFlash does not: refused, never ignored."""
    found = []
    dflash = config.get("dflash_config")
    if fmt.style == "hf":
        if not isinstance(dflash, dict):
            raise CheckpointError(
                f"{where}: no dflash_config object",
                expected="dflash_config {mask_token_id, target_layer_ids}",
                found=repr(dflash)[:80],
                fix="the directory is not a DFlash export",
            )
        found += [f"dflash_config.{k}" for k in sorted(dflash.keys() - _DFLASH_CONFIG_KEYS)]
        aux, ids = config.get("eagle_aux_hidden_state_layer_ids"), dflash.get("target_layer_ids")
        # vLLM's own edit (its speculators updater) writes aux as the same boundaries in its EAGLE-3 numbering
        if aux is not None and not (
            isinstance(ids, list)
            and all(isinstance(i, int) for i in ids)
            and aux == list(renumber(ids, "vllm-dflash", "vllm", None))
        ):
            found.append(
                "eagle_aux_hidden_state_layer_ids other than target_layer_ids + 1 (vLLM reads it instead "
                "of dflash_config.target_layer_ids)"
            )
    elif config.get("sliding_window_non_causal") is not True:
        found.append(
            f"sliding_window_non_causal={config.get('sliding_window_non_causal')!r} (vLLM then runs every layer causal)"
        )
    if fmt.style == "speculators" and config.get("sample_from_anchor", False):
        found.append("sample_from_anchor=true (anchor-first slots)")
    if layer.get("is_causal") or config.get("is_causal"):
        found.append("is_causal=true")
    if layer.get("is_neox_style", True) is not True or layer.get("rope_is_neox_style", True) is not True:
        found.append("is_neox_style=false")
    types = layer.get("layer_types")
    if types is not None and any(t != FULL for t in types):
        found.append(f"layer_types={types}")
    rope = layer.get("rope_parameters") or {}
    if layer.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        found.append("scaled RoPE")
    if found:
        raise CheckpointError(
            f"{where} asks for semantics eaglewire's DFlash does not compute",
            expected="a bidirectional, neox, full-attention, bonus-anchor DFlash draft",
            found="; ".join(found),
            fix="this draft needs the engine that trained it; "
            "eaglewire would decode (and the doctor check) another function",
        )


def _block_from(fmt: BlockFormat, config: dict[str, Any], where: str) -> BlockWiring:
    dflash = config.get("dflash_config") or {}
    src = config if fmt.style == "speculators" else {**config, **dflash}
    block_size = field_of(src, "block_size", int, where=where, error=CheckpointError, positive=True)
    mask = field_of(src, "mask_token_id", int, where=where, error=CheckpointError)
    try:
        return BlockWiring(block_size=block_size, mask_token_id=mask)
    except ContractMismatch as err:
        raise CheckpointError(f"{where}: {err}") from None


def _ids_from(fmt: BlockFormat, config: dict[str, Any], where: str) -> list[int]:
    ids = _path(config, fmt.ids_at)
    if not isinstance(ids, list) or not ids or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise CheckpointError(
            f"{where}: the layer-id list is missing or not a list of ints",
            expected=fmt.ids_at,
            found=repr(ids)[:80],
            fix="without it engines silently use a default tap formula; re-export with eaglewire",
        )
    return ids


def _draft_config(fmt: BlockFormat, config: dict[str, Any], contract: WiringContract, where: str) -> DraftConfig:
    layer = config.get("transformer_layer_config") if fmt.style == "speculators" else config
    if not isinstance(layer, dict):
        raise CheckpointError(
            f"{where}: transformer_layer_config is not an object",
            expected="a Qwen3 config",
            found=repr(layer)[:80],
            fix="the directory is not a speculators DFlash export",
        )
    try:
        return DraftConfig(
            hidden_size=layer["hidden_size"],
            intermediate_size=layer["intermediate_size"],
            num_attention_heads=layer["num_attention_heads"],
            num_key_value_heads=layer.get("num_key_value_heads") or layer["num_attention_heads"],
            head_dim=layer["head_dim"],
            target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
            num_taps=contract.num_taps,
            vocab_size=layer["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size") or layer["vocab_size"],
            num_layers=layer["num_hidden_layers"],
            rms_norm_eps=layer["rms_norm_eps"],
            rope_theta=_rope_theta(layer),
            max_position_embeddings=layer.get("max_position_embeddings", 2048),
        )
    except KeyError as err:
        raise CheckpointError(
            f"{where} lacks a required field",
            expected=str(err),
            found="missing",
            fix="the directory is not an export of this format",
        ) from None


def _contract_for(
    fmt: BlockFormat,
    config: dict[str, Any],
    directory: Path,
    target: TargetInfo | None,
    where: str,
    taps: tuple[int, ...] | None = None,
    vmap: VocabMap | None = None,
) -> WiringContract:
    from eaglewire.draft.dflash_contract import dflash_contract

    if taps is not None:  # the caller's boundaries (measured ones, or the doctor's placeholder): ids not read
        if target is None:
            raise CheckpointError(f"{where}: taps given without a target", expected="target=...", found="None")
        return dflash_contract(target, tuple(taps), _block_from(fmt, config, where), vmap)
    ids, block = _ids_from(fmt, config, where), _block_from(fmt, config, where)
    side = read_contract(directory)
    if side is not None:
        want = list(to_engine(side.taps, fmt.convention, side.target.num_layers))
        if side.family != fmt.family or side.block != block or want != ids:
            raise ContractMismatch(
                f"{where}: config.json disagrees with the wiring contract",
                expected=f"{fmt.convention} ids {want}, {side.block}",
                found=f"ids {ids}, {block}",
                fix="the config was edited after export; re-export from the native draft",
            )
        return side
    if target is None:
        raise CheckpointError(
            f"{directory} has no eaglewire_contract.json",
            expected="the contract side file, or --target to rebuild the contract",
            found="neither",
            fix="pass --target",
        )
    taps = from_engine(ids, fmt.convention, target.num_layers)
    return dflash_contract(target, taps, block, vmap)


def import_block_draft(
    directory: Path,
    fmt_name: str,
    *,
    family: str = "dflash",
    target: TargetInfo | None = None,
    dtype: torch.dtype | None = None,
    taps: tuple[int, ...] | None = None,
) -> tuple[DFlashDraft, WiringContract]:
    """Load a block-drafter export strictly: exact key set, shapes, one float dtype, finite weights, the ids and
    block wiring against the contract side file (or rebuilt on `target`). The target's embedding and head
    are attached when `target` is given. `taps` (with `target`): the contract's boundaries instead of the
    config's ids and any side file's (`eaglewire import` records the measured ones; the doctor measures
    a draft whose ids are what is under test)."""
    fmt, directory = block_format(family, fmt_name), Path(directory)
    where = f"{fmt.name} {family} export {directory}"
    config = read_draft_config(directory / "config.json")
    if fmt.style == "speculators":
        ok, expected = (
            is_speculators_config(config),
            (f"speculators_model_type {SPECULATORS_TYPE!r}, architectures [{SPECULATORS_ARCH!r}] or [{ZLAB_ARCH!r}]"),
        )
    else:
        ok = config.get("architectures") == [ZLAB_ARCH] and "speculators_model_type" not in config
        expected = f"architectures [{ZLAB_ARCH!r}], no speculators_model_type"
    if not ok:
        found = (
            f"architectures {config.get('architectures')!r}, speculators_model_type "
            f"{config.get('speculators_model_type')!r}"
        )
        raise CheckpointError(
            f"{where} is not a {fmt.name} DFlash config",
            expected=expected,
            found=found,
            fix="import it with the format that wrote it",
        )
    layer = config.get("transformer_layer_config") if fmt.style == "speculators" else config
    _refuse_semantics(fmt, config, layer if isinstance(layer, dict) else {}, where)
    tensors = read_safetensors(directory / WEIGHTS)
    contract = _contract_for(fmt, config, directory, target, where, taps, vocab_from_tensors(tensors, where))
    cfg = _draft_config(fmt, config, contract, where)
    assert contract.block is not None  # _contract_for compared it with the config's (a dflash contract has one)
    _refuse_unportable(contract.block, cfg, fmt.name)
    cfg.require_matches(contract)
    return _load_weights(DFlashDraft(cfg, contract), tensors, where, dtype, target, contract), contract


def import_block_backbone(
    directory: Path,
    fmt_name: str,
    *,
    target: TargetInfo,
    taps: tuple[int, ...],
    anchor_layout: str = "bonus",
    heads: tuple[str, ...] = (),
) -> DFlashDraft:
    """The DFlash backbone of a block drafter, for the doctor's measured wiring: of a DFlash draft, or of a
    family built on it (speculators' DSparkDraftModel is its DFlashDraftModel plus heads that bias the logits).
    The config read through format `fmt_name`'s fields, its block in the family's `anchor_layout` (the family
    record says which), the boundaries `taps` (the config's ids are what is under test), the backbone's weights
    checked as strictly as an import, the weights under the prefixes `heads` set aside, the target's embedding
    and head attached. Semantics eaglewire's DFlash does not compute are refused as on import."""
    fmt, directory = block_format("dflash", fmt_name), Path(directory)
    where = f"{fmt.name}-layout block-drafter backbone {directory}"
    config = read_draft_config(directory / "config.json")
    layer = config.get("transformer_layer_config") if fmt.style == "speculators" else config
    own = {k: v for k, v in config.items() if k != "sample_from_anchor" or anchor_layout != "anchor_first"}
    _refuse_semantics(fmt, own, layer if isinstance(layer, dict) else {}, where)
    block = dataclasses.replace(_block_from(fmt, config, where), anchor_layout=anchor_layout)
    tensors = {k: t for k, t in read_safetensors(directory / WEIGHTS).items() if not k.startswith(heads)}
    contract = _contract_for(fmt, config, directory, target, where, tuple(taps), vocab_from_tensors(tensors, where))
    contract = dataclasses.replace(contract, block=block)
    cfg = _draft_config(fmt, config, contract, where)
    cfg.require_matches(contract)
    return _load_weights(DFlashDraft(cfg, contract), tensors, where, None, target, contract)


def _load_weights(
    draft: DFlashDraft,
    tensors: dict[str, torch.Tensor],
    where: str,
    dtype: torch.dtype | None,
    target: TargetInfo | None,
    contract: WiringContract,
) -> DFlashDraft:
    """`tensors` into `draft` strictly: exact key set, shapes, one float dtype, finite values, a vocab map the
    contract names; `contract` attached."""
    draft = draft.fill_nan()
    reference = draft.state_dict()
    _check_keys(set(reference), set(tensors), set(), where)
    floats = _float_dtype(tensors, where)
    for k, t in tensors.items():
        _check_tensor(k, t, reference[k], floats, where)
    require_finite(tensors, where, CheckpointError)
    if draft.reduced:
        check_vocab_tensors(tensors, draft.cfg, contract, where)
    draft.to(getattr(torch, floats))
    draft.load_state_dict(tensors, strict=True)
    if dtype is not None:
        draft.to(dtype)
    if target is not None:
        draft.attach_target(target.embedding(), target.head_rows())
    draft.contract = contract
    return draft.eval()
