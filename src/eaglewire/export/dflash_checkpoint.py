"""Native DFlash checkpoint: a directory with `model.safetensors` (z-lab's HF weight names, no embedding and no
head: both are the target's) + `config.json` embedding the draft config and the contract (family dflash, its
block wiring). What `eaglewire train --family dflash` writes (final draft, snapshots, resumable checkpoints).

Loading is as strict as the EAGLE-3 checkpoint's: exact key set (a renamed key is reported with the closest
expected name), exact shapes, one float dtype, finite values, the config against the contract, the contract
against the target. Every weight starts as NaN, so one that was not loaded cannot go unnoticed. No pickle.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

import eaglewire
from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.load import _check_keys, _check_tensor, _float_dtype
from eaglewire.errors import CheckpointError
from eaglewire.export.checkpoint import _replace_dir
from eaglewire.safeio import about_file, atomic_save_safetensors, atomic_write_json, field_of, read_json_object, \
    read_safetensors_file, require_finite

FORMAT = "eaglewire.dflash/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
_CONFIG_KEYS = {"format", "eaglewire_version", "draft", "contract", "dtype"}


def save_dflash_checkpoint(draft: DFlashDraft, contract: WiringContract, out: Path, *,
                           dtype: torch.dtype | None = None) -> Path:
    """Write `out/` atomically (a temp directory renamed into place). Float weights cast to `dtype` if given."""
    if contract.block is None or contract.block != draft.block:
        raise CheckpointError("the DFlash draft's block wiring is not the contract's", expected=str(contract.block),
                              found=str(draft.block), fix="save the draft with the contract it was built for")
    draft.cfg.require_matches(contract)
    state = {k: (v.to(dtype) if dtype is not None else v).detach().contiguous() for k, v in draft.state_dict().items()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        atomic_save_safetensors(state, tmp / WEIGHTS, metadata={"format": FORMAT})
        atomic_write_json(tmp / CONFIG, {"format": FORMAT, "eaglewire_version": eaglewire.__version__,
                                         "draft": draft.cfg.to_dict(), "contract": contract.to_dict(),
                                         "dtype": _float_dtype(state, str(out))})
        _replace_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def read_dflash_config(path: Path) -> tuple[DraftConfig, WiringContract, dict]:
    cfg_path = Path(path) / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(f"{path} is not an eaglewire DFlash checkpoint", expected=f"{CONFIG} and {WEIGHTS}",
                              found=f"no {CONFIG}", fix="point at the directory `eaglewire train --family dflash` wrote")
    meta = read_json_object(cfg_path, what="a DFlash checkpoint config", error=CheckpointError)
    if meta.get("format") != FORMAT or set(meta) != _CONFIG_KEYS:
        raise CheckpointError(f"{cfg_path} is not an eaglewire DFlash checkpoint config",
                              expected=f"format={FORMAT} with keys {sorted(_CONFIG_KEYS)}",
                              found=f"format={meta.get('format')!r}, keys {sorted(meta)}")
    for key, kind in (("draft", dict), ("contract", dict), ("dtype", str)):
        field_of(meta, key, kind, where=str(cfg_path), error=CheckpointError)
    with about_file(cfg_path):
        contract = WiringContract.from_dict(meta["contract"])
        cfg = DraftConfig.from_dict(meta["draft"])
        cfg.require_matches(contract)
    if contract.block is None:
        raise CheckpointError(f"{cfg_path}: the contract is not a block drafter's", expected="family dflash",
                              found=f"family {contract.family!r}", fix="load EAGLE-3 drafts with load_checkpoint")
    return cfg, contract, meta


def load_dflash_checkpoint(path: Path, *, target: Any = None,
                           dtype: torch.dtype | None = torch.float32) -> DFlashDraft:
    """Load strictly; with `target` (a TargetInfo with embedding() and head_rows()), require the contract to be
    for it and attach its embedding and head."""
    path = Path(path)
    cfg, contract, meta = read_dflash_config(path)
    if target is not None:
        contract.require_target(target.identity, where=f"DFlash checkpoint {path}")
    where = f"DFlash checkpoint {path / WEIGHTS}"
    tensors = read_safetensors_file(path / WEIGHTS, what="DFlash draft weights", error=CheckpointError)
    assert contract.block is not None  # read_dflash_config refuses a contract without one
    draft = DFlashDraft(cfg, contract.block).fill_nan()
    reference = draft.state_dict()
    _check_keys(set(reference), set(tensors), set(), where)
    for k, t in tensors.items():
        _check_tensor(k, t, reference[k], meta["dtype"], where)
    require_finite(tensors, where, CheckpointError)
    draft.to(getattr(torch, meta["dtype"]))
    with torch.no_grad():
        for k, p in draft.state_dict().items():
            p.copy_(tensors[k])
    if dtype is not None:
        draft.to(dtype)
    if target is not None:
        draft.attach_target(target.embedding(), target.head_rows())
    draft.contract = contract
    return draft.eval()
