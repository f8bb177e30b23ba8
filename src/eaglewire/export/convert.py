"""Export a native draft to an engine layout and import it back, strictly.

`native` (eaglewire.export.checkpoint) is one of the formats: the same strict loader reads it, so any-to-any
conversion is import A then export B, and export -> import is bit-identical for every format (tested). A missing or
unexpected key, a wrong shape, a layer-id list that was lost or disagrees with
the contract, or a missing vocab map stops the conversion with a message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract, default_taps, from_engine
from eaglewire.norms import NormFlags
from eaglewire.draft.load import EMBED_KEY as EMBED
from eaglewire.draft.load import load_strict
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError, ContractMismatch, EaglewireError
from eaglewire.export.engines import ENGINE_FORMATS, FORMATS, NATIVE, Engine, engine_for
from eaglewire.export.block import block_family, export_block_draft, foreign_block_family
from eaglewire.export.block_import import import_block_draft
from eaglewire.export.block_formats import is_block_family
from eaglewire.export.base import (
    cast_floats,
    read_contract,
    read_draft_config,
    read_safetensors,
    rename_all,
    write_dir,
    CONTRACT_FILE,
    WEIGHTS,
)
from eaglewire.export.llamacpp_layout import GGUF_FILE, STYLE as GGUF_STYLE
from eaglewire.export.layouts import (
    check_exportable,
    config_ids,
    draft_config_from,
    from_native,
    make_config,
    native_to,
)
from eaglewire.safeio import about_file
from eaglewire.draft.vocab import VocabMap
from eaglewire.target.protocol import TargetInfo

__all__ = ["FORMATS", "check_out", "detect_engine", "export_draft", "import_draft"]


def check_out(out: Path, fmt: str, *, force: bool = False, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse an `out` that `export_draft(..., fmt)` would refuse (eaglewire.outputs), before any work."""
    from eaglewire.export.base import is_export
    from eaglewire.export.checkpoint import CONFIG, is_checkpoint
    from eaglewire.outputs import check_output_dir

    native = fmt == NATIVE
    check_output_dir(
        out,
        names=(WEIGHTS, CONFIG) if native else (WEIGHTS, CONFIG, CONTRACT_FILE, GGUF_FILE),
        owned=is_checkpoint if native else is_export,
        force=force,
        inputs=inputs,
        what="checkpoint" if native else "export",
    )


def export_draft(
    draft: Eagle3Draft | DFlashDraft,
    contract: WiringContract,
    out: Path,
    fmt: str,
    *,
    dtype: torch.dtype | None = None,
    with_embedding: bool | None = None,
    verifier: str | None = None,
    engine_version: str | None = None,
    force: bool = False,
    inputs: tuple[Path, ...] = (),
    gguf_dtype: str | None = None,
    vocab_from: Path | None = None,
) -> Path:
    """Write `draft` in the layout `fmt` names (FORMATS) plus the contract side file; `verifier` is for vLLM,
    `engine_version` the engine release whose layer-id rule applies (SGLang; default: the newest verified).
    llamacpp: `gguf_dtype` f32 / f16 / bf16 / q8_0 (default: `dtype`'s, else the draft's), `vocab_from` the target
    GGUF whose vocabulary the draft carries (export/gguf_draft.py).
    An existing `out` must be an earlier export (or `force`) and never one of `inputs` (eaglewire.outputs)."""
    if fmt in ENGINE_FORMATS and engine_for(fmt, engine_version).config_style == GGUF_STYLE:
        from eaglewire.export.gguf_draft import export_gguf

        floats = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
        name = (
            gguf_dtype or floats[dtype or next(v.dtype for v in draft.state_dict().values() if v.is_floating_point())]
        )
        return export_gguf(
            draft,
            contract,
            out,
            dtype=name,
            vocab_from=vocab_from,
            with_embedding=bool(with_embedding),
            version=engine_version,
            force=force,
            inputs=inputs,
        )
    if is_block_family(contract.family) and fmt != NATIVE:  # a block drafter: its family's format records
        assert isinstance(draft, DFlashDraft), f"a {contract.family} contract on a {type(draft).__name__}"
        return export_block_draft(draft, contract, out, fmt, dtype=dtype, verifier=verifier, force=force, inputs=inputs)
    if fmt == NATIVE:
        from eaglewire.export.checkpoint import save_checkpoint

        return save_checkpoint(
            draft, contract, out, save_embedding=bool(with_embedding), dtype=dtype, force=force, inputs=inputs
        )
    layout = engine_for(fmt, engine_version)
    draft.cfg.require_matches(contract)
    check_exportable(layout, draft.cfg)
    keep_embed = layout.with_embedding if with_embedding is None else with_embedding
    state = {k: v for k, v in draft.state_dict().items() if keep_embed or k != EMBED}
    tensors = rename_all(cast_floats(state, dtype), lambda k: native_to(layout, k), f"export to {fmt}")
    float_dtype = next(v.dtype for v in tensors.values() if v.is_floating_point())
    config = make_config(layout, draft.cfg, contract, str(float_dtype).removeprefix("torch."), verifier)
    return write_dir(out, config, tensors, contract, force=force, inputs=inputs)


def _contract_for(
    layout: Engine,
    config: dict[str, Any],
    native: dict[str, torch.Tensor],
    directory: Path,
    target: TargetInfo | None,
    flags: NormFlags,
) -> WiringContract:
    ids = config_ids(layout, config, str(directory / "config.json"))
    if ids is None and not layout.hard_coded_taps:
        raise CheckpointError(
            f"{directory}: the layer-id list is missing from config.json",
            expected=layout.id_keys[0],
            found="absent",
            fix="without it the engine silently uses its default taps; re-export with eaglewire",
        )
    side = read_contract(directory)
    if side is not None:
        conv = layout.convention_for(side.target.architecture)
        if ids is not None and list(side.engine_ids(conv)) != list(ids):
            raise ContractMismatch(
                f"{directory}: config.json layer ids disagree with the wiring contract",
                expected=f"{layout.rule_note(side.target.architecture) or conv} ids "
                f"{list(side.engine_ids(conv))} "
                f"(taps {list(side.taps)})",
                found=f"config ids {ids}",
                fix="the config was edited after export; re-export from the native draft",
            )
        return side
    if target is None:
        raise CheckpointError(
            f"{directory} has no {'eaglewire_contract.json'}",
            expected="the contract side file, or --target to rebuild the contract",
            found="neither",
            fix="pass --target (the trained boundaries are then measured on it)",
        )
    L = target.num_layers
    conv = layout.convention_for(target.identity.architecture)
    taps = default_taps(L) if ids is None else from_engine(ids, conv, L)
    return target.contract(taps, norm=flags, vocab_map=_vocab_map(native, directory))


def _vocab_map(native: dict[str, torch.Tensor], directory: Path) -> VocabMap:
    if "d2t" not in native or "t2d" not in native:
        raise CheckpointError(
            f"{directory}: the vocab map is missing",
            expected="d2t and t2d tensors",
            found=f"{'d2t' in native=}, {'t2d' in native=}",
            fix="without d2t engines map draft id i to target id i",
        )
    with about_file(directory / WEIGHTS):  # the map's own checks name no file
        return VocabMap(d2t=native["d2t"], t2d=native["t2d"])


def import_draft(
    directory: Path,
    fmt: str,
    *,
    target: TargetInfo | None = None,
    taps: tuple[int, ...] | None = None,
    engine_version: str | None = None,
) -> tuple[Eagle3Draft | DFlashDraft, WiringContract]:
    """Load an exported draft strictly into the native model (float weights keep the file's dtype).

    taps: boundaries measured by the caller (eaglewire.doctor): the contract is built from `target` with
    them, and neither the config's layer ids nor a contract side file is read."""
    if fmt == NATIVE:
        return _import_native(Path(directory), target, taps)
    if fmt in ENGINE_FORMATS and engine_for(fmt, engine_version).config_style == GGUF_STYLE:
        from eaglewire.export.gguf_import import import_gguf

        return import_gguf(Path(directory), target=target, taps=taps)
    family = block_family(Path(directory) / "config.json")
    if family is not None:  # a block drafter's export (z-lab, SGLang, speculators DFlash configs)
        return import_block_draft(Path(directory), fmt, family=family, target=target, taps=taps)
    layout, directory = engine_for(fmt, engine_version), Path(directory)
    config = read_draft_config(directory / "config.json")
    foreign = foreign_block_family(config)
    if foreign is not None:
        raise CheckpointError(
            f"{directory} is a {foreign} block drafter",
            expected="an EAGLE-3 or DFlash export",
            found=f"a {foreign} config",
            fix="eaglewire does not compute this family yet; "
            f"check its wiring with eaglewire doctor {directory} --engine vllm|sglang",
        )
    where = f"{fmt} export {directory}"
    native = rename_all(read_safetensors(directory / WEIGHTS), lambda k: from_native(layout, k), where)
    # the norm flags as this layout means them (SpecForge's norm_output is not SGLang's): a contract
    # rebuilt from the raw config fields would disagree with the draft config read below
    with about_file(directory / "config.json"):
        flags = draft_config_from(layout, config, 1).norm
    if taps is not None:
        if target is None:
            raise CheckpointError("measured taps need the target", expected="target=...", found="None")
        contract = target.contract(tuple(taps), norm=flags, vocab_map=_vocab_map(native, directory))
    else:
        contract = _contract_for(layout, config, native, directory, target, flags)
    with about_file(directory / "config.json"):
        cfg = draft_config_from(layout, config, contract.num_taps)
    draft = load_strict(cfg, contract, native, where, embedding=None, target=target)
    return draft, contract


def _import_native(
    directory: Path, target: TargetInfo | None, taps: tuple[int, ...] | None
) -> tuple[Eagle3Draft, WiringContract]:
    from eaglewire.export.checkpoint import load_checkpoint

    if taps is not None:
        raise CheckpointError(
            f"{directory} is a native checkpoint: it carries its contract",
            expected="no measured taps",
            found=f"taps {list(taps)}",
            fix="measured taps are for drafts from other tools (engine layouts)",
        )
    draft = load_checkpoint(directory, target=target, dtype=None)
    assert draft.contract is not None  # the native loader attaches the stored one
    return draft, draft.contract


def detect_engine(config: dict[str, Any]) -> str:
    """The engine layout an exported config.json was written in (its own keys say it)."""
    if "speculators_model_type" in config:
        return "vllm"
    archs = config.get("architectures") or []
    if "LlamaForCausalLMEagle3" in archs:
        return "sglang"
    if config.get("format") == "eaglewire.draft/1":
        raise EaglewireError(
            "this is a native eaglewire checkpoint, not an engine export",
            expected="an exported directory, or --engine to check it as that engine would load it",
            found="format eaglewire.draft/1",
            fix="eaglewire export DIR --format sglang|vllm ...",
        )
    return "eagle"
