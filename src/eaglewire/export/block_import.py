"""Block drafters' (DFlash) exports read back strictly: the config through its format record (export/block.py
says what each format's config holds), the semantics eaglewire's DFlash does not compute refused, the ids and
block wiring checked against the contract side file (or the contract rebuilt on a target), the weights loaded
with the native loader's checks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract, from_engine, renumber, to_engine
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.dflash_contract import dflash_contract
from eaglewire.draft.load import _check_keys, _check_tensor, _float_dtype, check_vocab_tensors, vocab_from_tensors
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.export.base import WEIGHTS, read_contract, read_draft_config, read_safetensors
from eaglewire.export.block import (
    SPECULATORS_ARCH,
    SPECULATORS_TYPE,
    ZLAB_ARCH,
    config_at,
    is_speculators_config,
    refuse_unportable,
)
from eaglewire.export.block_formats import BlockFormat, block_format
from eaglewire.export.layouts import _rope_theta
from eaglewire.families import FULL, BlockWiring
from eaglewire.safeio import field_of, require_finite
from eaglewire.target.protocol import TargetInfo

# dflash_config fields eaglewire reads; any other one (use_swa, attention_sink_bias, causal, ...) changes what
# the engine computes and is refused on import
_DFLASH_CONFIG_KEYS = frozenset({"mask_token_id", "target_layer_ids", "block_size", "num_target_layers"})


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
    ids = config_at(config, fmt.ids_at)
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
    refuse_unportable(contract.block, cfg, fmt.name)
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
