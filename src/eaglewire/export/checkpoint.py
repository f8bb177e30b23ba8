"""Native draft checkpoint: a directory with `model.safetensors` + `config.json` embedding the contract.

Loading is strict (eaglewire.draft.load, the loader every import shares): exact key set (a renamed key
is reported with the closest expected name), exact shapes, dtypes, the d2t/t2d invariants and their
hash, the config against the contract, and the contract against the target it is used with. Every
weight starts as NaN, so one that was not loaded cannot go unnoticed. No pickle.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from typing import Any

import torch
import eaglewire
from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.load import EMBED_KEY, load_strict
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError
from eaglewire.safeio import atomic_save_safetensors, atomic_write_json, about_file, field_of, read_json_object, \
    read_safetensors_file
from eaglewire.target.protocol import TargetInfo
from eaglewire.draft.vocab import validate_vocab_map, vocab_map_sha256

FORMAT = "eaglewire.draft/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
_CONFIG_KEYS = {"format", "eaglewire_version", "draft", "contract", "saved_embedding", "dtype"}


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move a finished temp dir into place; an existing checkpoint is swapped out, then removed."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old)


def save_checkpoint(draft: Eagle3Draft, contract: WiringContract, out: Path, *,
                    save_embedding: bool = False, dtype: torch.dtype | None = None) -> Path:
    """Write `out/` atomically. Float weights are cast to `dtype` if given (e.g. bf16 for release)."""
    draft.cfg.require_matches(contract)
    validate_vocab_map(draft.d2t, draft.t2d, draft.cfg.vocab_size)
    if contract.vocab_map_sha256 != vocab_map_sha256(draft.d2t, draft.cfg.vocab_size):
        raise CheckpointError("the draft's vocab map is not the one named by the contract",
                              expected=f"vocab_map_sha256={contract.vocab_map_sha256}",
                              found=vocab_map_sha256(draft.d2t, draft.cfg.vocab_size))
    state = {k: v for k, v in draft.state_dict().items() if save_embedding or k != EMBED_KEY}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    float_dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        atomic_save_safetensors(state, tmp / WEIGHTS, metadata={"format": FORMAT})
        atomic_write_json(tmp / CONFIG, {
            "format": FORMAT, "eaglewire_version": eaglewire.__version__, "draft": draft.cfg.to_dict(),
            "contract": contract.to_dict(), "saved_embedding": save_embedding,
            "dtype": str(float_dtype).removeprefix("torch."),
        })
        _replace_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def read_checkpoint_config(path: Path) -> tuple[DraftConfig, WiringContract, dict[str, Any]]:
    cfg_path = Path(path) / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(f"{path} is not an eaglewire checkpoint", expected=f"{CONFIG} and {WEIGHTS}",
                              found=f"no {CONFIG}", fix="point at the directory `eaglewire train` wrote")
    meta = read_json_object(cfg_path, what="a native checkpoint config", error=CheckpointError)
    if meta.get("format") != FORMAT or set(meta) != _CONFIG_KEYS:
        raise CheckpointError(f"{cfg_path} is not an eaglewire native checkpoint config",
                              expected=f"format={FORMAT} with keys {sorted(_CONFIG_KEYS)}",
                              found=f"format={meta.get('format')!r}, keys {sorted(meta)}",
                              fix="use `eaglewire import` for SGLang/vLLM/EAGLE/SpecForge layouts")
    for key, kind in (("draft", dict), ("contract", dict), ("saved_embedding", bool), ("dtype", str)):
        field_of(meta, key, kind, where=str(cfg_path), error=CheckpointError)
    if meta["dtype"] not in ("float32", "float16", "bfloat16"):
        raise CheckpointError(f"{cfg_path}: field 'dtype' names no float dtype a draft is saved in",
                              expected="float32, float16 or bfloat16", found=repr(meta["dtype"]))
    with about_file(cfg_path):
        contract = WiringContract.from_dict(meta["contract"])
        cfg = DraftConfig.from_dict(meta["draft"])
        cfg.require_matches(contract)
    return cfg, contract, meta


def load_checkpoint(path: Path, *, target: TargetInfo | None = None,
                    dtype: torch.dtype | None = torch.float32) -> Eagle3Draft:
    """Load strictly (the loader imports share). With `target`, also require the contract to be for it
    and attach its embedding. The draft's `contract` is the one stored with it. dtype None: as saved."""
    path = Path(path)
    cfg, contract, meta = read_checkpoint_config(path)
    if target is not None:
        contract.require_target(target.identity, where=f"checkpoint {path}")
        _require_template(contract, target, path)
    tensors = read_safetensors_file(path / WEIGHTS, what="draft weights", error=CheckpointError)
    return load_strict(cfg, contract, tensors, f"checkpoint {path / WEIGHTS}", embedding=meta["saved_embedding"],
                       float_dtype=meta["dtype"], target=target, dtype=dtype)


def _require_template(contract: WiringContract, target: TargetInfo, path: Path) -> None:
    found = target.chat_template_sha256
    if contract.chat_template_sha256 is not None and found != contract.chat_template_sha256:
        raise CheckpointError(f"checkpoint {path} was trained with another chat template",
                              expected=f"chat_template_sha256={contract.chat_template_sha256}",
                              found=f"chat_template_sha256={found}",
                              fix="serve with the template used in training, or retrain on this one")


def released_draft_dir() -> Path:
    """The draft released inside the package for the embedded default target (SmolLM2-135M)."""
    from importlib.resources import files

    shipped = Path(str(files("eaglewire") / "assets" / "drafts" / "smollm2-135m"))
    if not (shipped / "model.safetensors").is_file():
        raise CheckpointError("no released draft in this install", expected=str(shipped),
                              found="missing", fix="pass --draft DIR (from `eaglewire train`)")
    return shipped


def resolve_draft(draft: Path | None) -> Path:
    """`draft`, or the released draft inside the package (for the embedded default target) when None."""
    return Path(draft) if draft is not None else released_draft_dir()
