"""Native draft checkpoint: a directory with `model.safetensors` + `config.json` embedding the contract.

Loading is strict (eaglewire.draft.load, the loader every import shares): exact key set (a renamed key
is reported with the closest expected name), exact shapes, dtypes, the d2t/t2d invariants and their
hash, the config against the contract, and the contract against the target it is used with. Every
weight starts as NaN, so one that was not loaded cannot go unnoticed. No pickle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.load import EMBED_KEY, loader_for
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError
from eaglewire.families import get_family, register_part
from eaglewire.export.base import read_draft_config
from eaglewire.outputs import replace_dir
from eaglewire.safeio import atomic_save_safetensors, atomic_write_json, about_file, field_of, read_safetensors_file
from eaglewire.target.protocol import TargetInfo
from eaglewire.about import __version__
from eaglewire.draft.vocab import validate_vocab_map, vocab_map_sha256

FORMAT = "eaglewire.draft/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
_CONFIG_KEYS = {"format", "eaglewire_version", "draft", "contract", "saved_embedding", "dtype"}


def is_checkpoint(directory: Path) -> bool:
    """A native checkpoint: its config.json names this format."""
    try:
        return bool(json.loads((Path(directory) / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def _eagle3_state(draft: Eagle3Draft, contract: WiringContract, save_embedding: bool) -> dict[str, torch.Tensor]:
    validate_vocab_map(draft.d2t, draft.t2d, draft.cfg.vocab_size)
    if contract.vocab_map_sha256 != vocab_map_sha256(draft.d2t, draft.cfg.vocab_size):
        raise CheckpointError(
            "the draft's vocab map is not the one named by the contract",
            expected=f"vocab_map_sha256={contract.vocab_map_sha256}",
            found=vocab_map_sha256(draft.d2t, draft.cfg.vocab_size),
        )
    return {k: v for k, v in draft.state_dict().items() if save_embedding or k != EMBED_KEY}


def _dflash_state(draft: Any, contract: WiringContract, save_embedding: bool) -> dict[str, torch.Tensor]:
    if save_embedding or draft.contract.block != contract.block:  # the draft's wiring is its own contract's
        raise CheckpointError(
            "a DFlash checkpoint holds its own weights, wired as its contract says",
            expected=f"no embedding; block {draft.contract.block}",
            found=f"save_embedding={save_embedding}; block {contract.block}",
        )
    return dict(draft.state_dict())  # z-lab's keys; the target's embedding and head are never in it


# What each drafter family writes: its tensors, checked against the contract (its record's part).
register_part("eagle3", "checkpoint_state", _eagle3_state)
register_part("dflash", "checkpoint_state", _dflash_state)


def save_checkpoint(
    draft: Any,
    contract: WiringContract,
    out: Path,
    *,
    save_embedding: bool = False,
    dtype: torch.dtype | None = None,
    force: bool = False,
    inputs: tuple[Path, ...] = (),
) -> Path:
    """Write `out/` atomically. Float weights are cast to `dtype` if given (e.g. bf16 for release). An existing
    `out` must be an earlier checkpoint (or `force`), and is never one of `inputs` (eaglewire.outputs)."""
    draft.cfg.require_matches(contract)
    state_of: Callable[[Any, WiringContract, bool], dict[str, torch.Tensor]] = get_family(contract.family).part(
        "checkpoint_state"
    )
    state = state_of(draft, contract, save_embedding)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    float_dtype = next(v.dtype for v in state.values() if v.is_floating_point())

    def fill(tmp: Path) -> None:
        atomic_save_safetensors(state, tmp / WEIGHTS, metadata={"format": FORMAT})
        atomic_write_json(
            tmp / CONFIG,
            {
                "format": FORMAT,
                "eaglewire_version": __version__,
                "draft": draft.cfg.to_dict(),
                "contract": contract.to_dict(),
                "saved_embedding": save_embedding,
                "dtype": str(float_dtype).removeprefix("torch."),
            },
        )

    return replace_dir(
        Path(out), fill, names=(WEIGHTS, CONFIG), owned=is_checkpoint, force=force, inputs=inputs, what="checkpoint"
    )


def read_checkpoint_config(path: Path) -> tuple[DraftConfig, WiringContract, dict[str, Any]]:
    cfg_path = Path(path) / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(
            f"{path} is not an eaglewire checkpoint",
            expected=f"{CONFIG} and {WEIGHTS}",
            found=f"no {CONFIG}",
            fix="point at the directory `eaglewire train` wrote",
        )
    meta = read_draft_config(cfg_path)
    if meta.get("format") != FORMAT or set(meta) != _CONFIG_KEYS:
        raise CheckpointError(
            f"{cfg_path} is not an eaglewire native checkpoint config",
            expected=f"format={FORMAT} with keys {sorted(_CONFIG_KEYS)}",
            found=f"format={meta.get('format')!r}, keys {sorted(meta)}",
            fix="use `eaglewire import` for SGLang/vLLM/EAGLE/SpecForge layouts",
        )
    for key, kind in (("draft", dict), ("contract", dict), ("saved_embedding", bool), ("dtype", str)):
        field_of(meta, key, kind, where=str(cfg_path), error=CheckpointError)
    if meta["dtype"] not in ("float32", "float16", "bfloat16"):
        raise CheckpointError(
            f"{cfg_path}: field 'dtype' names no float dtype a draft is saved in",
            expected="float32, float16 or bfloat16",
            found=repr(meta["dtype"]),
        )
    with about_file(cfg_path):
        contract = WiringContract.from_dict(meta["contract"])
        cfg = DraftConfig.from_dict(meta["draft"])
        cfg.require_matches(contract)
    return cfg, contract, meta


def load_checkpoint(path: Path, *, target: TargetInfo | None = None, dtype: torch.dtype | None = torch.float32) -> Any:
    """Load strictly (the loader imports share, keyed by the contract's family: an Eagle3Draft or a
    DFlashDraft). With `target`, also require the contract to be for it and attach its embedding (and, for a
    DFlash draft, its head). The draft's `contract` is the one stored with it. dtype None: as saved."""
    path = Path(path)
    cfg, contract, meta = read_checkpoint_config(path)
    if target is not None:
        contract.require_target(target.identity, where=f"checkpoint {path}")
        _require_template(contract, target, path)
    tensors = read_safetensors_file(path / WEIGHTS, what="draft weights", error=CheckpointError)
    return loader_for(contract)(
        cfg,
        contract,
        tensors,
        f"checkpoint {path / WEIGHTS}",
        embedding=meta["saved_embedding"],
        float_dtype=meta["dtype"],
        target=target,
        dtype=dtype,
    )


def _require_template(contract: WiringContract, target: TargetInfo, path: Path) -> None:
    found = target.chat_template_sha256
    if contract.chat_template_sha256 is not None and found != contract.chat_template_sha256:
        raise CheckpointError(
            f"checkpoint {path} was trained with another chat template",
            expected=f"chat_template_sha256={contract.chat_template_sha256}",
            found=f"chat_template_sha256={found}",
            fix="serve with the template used in training, or retrain on this one",
        )


def released_draft_dir() -> Path:
    """The draft released inside the package for the embedded default target (SmolLM2-135M)."""
    from importlib.resources import files

    shipped = Path(str(files("eaglewire") / "assets" / "drafts" / "smollm2-135m"))
    if not (shipped / "model.safetensors").is_file():
        raise CheckpointError(
            "no released draft in this install",
            expected=str(shipped),
            found="missing",
            fix="pass --draft DIR (from `eaglewire train`)",
        )
    return shipped


def resolve_draft(draft: Path | None) -> Path:
    """`draft`, or the released draft inside the package (for the embedded default target) when None."""
    return Path(draft) if draft is not None else released_draft_dir()
