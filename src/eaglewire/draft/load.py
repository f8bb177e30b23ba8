"""The one strict loader behind the native checkpoint (eaglewire.export.checkpoint) and every import
(eaglewire.export.convert): tensors already renamed to native names become an Eagle3Draft, or nothing.
Each family's strict loader is its record's "load_strict" part (families.py; a DFlash draft: `load_dflash_strict`).

Checked, in order: the exact key set (a renamed key is reported with its likely intended name), shapes,
dtypes (one float dtype), the d2t/t2d invariants and their hash against the contract. The model starts
with every weight NaN, so a weight that was not loaded cannot pass. The draft carries its contract.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

import torch

from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.families import get_family, register_part
from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.safeio import about_file, require_finite
from eaglewire.draft.vocab import VocabMap, validate_vocab_map, vocab_map_sha256
from eaglewire.target.protocol import TargetInfo

EMBED_KEY = "embed_tokens.weight"  # the target's frozen embedding: in a file only when saved with it


def _check_keys(expected: set[str], found: set[str], optional: set[str], where: str) -> None:
    missing, unexpected = sorted(expected - found - optional), sorted(found - expected)
    if not (missing or unexpected):
        return
    hints = []
    for k in unexpected:
        close = difflib.get_close_matches(k, missing, n=1)
        hints.append(f"{k!r} -> did you mean {close[0]!r}?" if close else f"{k!r} is not a draft weight")
    raise CheckpointError(
        f"{where} has the wrong set of tensors",
        expected=f"missing {missing}" if missing else "no missing keys",
        found=f"unexpected {unexpected}" if unexpected else "no unexpected keys",
        fix="; ".join(hints) or "re-export the checkpoint; nothing is loaded non-strictly",
    )


def _float_dtype(tensors: dict[str, torch.Tensor], where: str) -> str:
    floats = {str(v.dtype).removeprefix("torch.") for v in tensors.values() if v.is_floating_point()}
    if len(floats) != 1:
        raise CheckpointError(f"{where}: mixed float dtypes", expected="one dtype", found=str(sorted(floats)))
    return floats.pop()


def _check_tensor(key: str, t: torch.Tensor, ref: torch.Tensor, float_dtype: str, where: str) -> None:
    if tuple(t.shape) != tuple(ref.shape):
        raise CheckpointError(
            f"{where}: tensor {key!r} has the wrong shape", expected=str(tuple(ref.shape)), found=str(tuple(t.shape))
        )
    want = str(ref.dtype).removeprefix("torch.") if not ref.is_floating_point() else float_dtype
    got = str(t.dtype).removeprefix("torch.")
    if got != want:
        raise CheckpointError(f"{where}: tensor {key!r} has the wrong dtype", expected=want, found=got)


def check_vocab_tensors(
    tensors: dict[str, torch.Tensor], cfg: DraftConfig, contract: WiringContract, where: str
) -> None:
    """A checkpoint's d2t/t2d keep the vocab map's invariants and are the map the contract names (its hash)."""
    with about_file(where):  # the map's own checks see tensors, not the file they came from
        validate_vocab_map(tensors["d2t"], tensors["t2d"], cfg.vocab_size)
    found = vocab_map_sha256(tensors["d2t"], cfg.vocab_size)
    if found != contract.vocab_map_sha256:
        raise ContractMismatch(
            f"{where}: d2t is not the vocab map named by the contract",
            expected=f"vocab_map_sha256={contract.vocab_map_sha256}",
            found=found,
        )


def vocab_from_tensors(tensors: dict[str, torch.Tensor], where: str) -> VocabMap | None:
    """The reduced vocabulary a checkpoint's weights carry (d2t and t2d, checked), None where they hold neither."""
    if "d2t" not in tensors and "t2d" not in tensors:
        return None
    if "d2t" not in tensors or "t2d" not in tensors:
        raise CheckpointError(
            f"{where}: half a vocab map",
            expected="d2t and t2d, or neither",
            found=f"only {'d2t' if 'd2t' in tensors else 't2d'}",
            fix="re-export the draft",
        )
    with about_file(where):
        return VocabMap(d2t=tensors["d2t"], t2d=tensors["t2d"])


def load_strict(
    cfg: DraftConfig,
    contract: WiringContract,
    tensors: dict[str, torch.Tensor],
    where: str,
    *,
    embedding: bool | None,
    float_dtype: str | None = None,
    target: TargetInfo | None = None,
    dtype: torch.dtype | None = None,
) -> Eagle3Draft:
    """An Eagle3Draft holding exactly `tensors` (native names), in eval mode, with `contract` attached.

    embedding: True = the tensors must hold embed_tokens, False = they must not, None = either.
    float_dtype: the float dtype the tensors must have (None: any, as long as it is one).
    target: supplies the embedding when the tensors do not. dtype: cast after loading (None: keep)."""
    cfg.require_matches(contract, where)
    draft = Eagle3Draft(cfg).fill_nan()
    reference = draft.state_dict()  # detached views sharing storage with the parameters and buffers
    expected = {k for k in reference if k != EMBED_KEY or embedding is not False}
    _check_keys(expected, set(tensors), set() if embedding else {EMBED_KEY}, where)
    floats = float_dtype or _float_dtype(tensors, where)
    for k, t in tensors.items():
        _check_tensor(k, t, reference[k], floats, where)
    require_finite(tensors, where, CheckpointError)  # NaN or +-inf: a diverged run or a damaged file
    check_vocab_tensors(tensors, cfg, contract, where)
    draft.to(getattr(torch, floats))  # .to() replaces the parameters' storage: take fresh views after it
    own = draft.state_dict()
    with torch.no_grad():
        for k, t in tensors.items():  # the key set was checked exactly above
            own[k].copy_(t)
    if dtype is not None:
        draft.to(dtype)
    if EMBED_KEY in tensors:
        draft.embedding_attached = True
    elif target is not None:
        draft.attach_embedding(target.embedding().to(draft.fc.weight.dtype))
    # The sentinel marks what this loader fills from `tensors`; an embedding the target supplies is not one
    # of those (a boundaries dump's stand-in gives NaN rows for the tokens it lacks on purpose:
    # capture/boundary_file.py)
    for name, p in draft.named_parameters():
        if (name != EMBED_KEY or EMBED_KEY in tensors) and torch.isnan(p).any():
            raise CheckpointError(f"{where}: weight {name!r} was never loaded (NaN sentinel remains)")
    draft.contract = contract
    return draft.eval()


def load_dflash_strict(
    cfg: DraftConfig,
    contract: WiringContract,
    tensors: dict[str, torch.Tensor],
    where: str,
    *,
    embedding: bool | None = None,
    float_dtype: str | None = None,
    target: TargetInfo | None = None,
    dtype: torch.dtype | None = None,
) -> DFlashDraft:
    """A DFlashDraft holding exactly `tensors` (z-lab's names), in eval mode, `contract` attached; the target's
    embedding and head attached when `target` is given (they are never in a DFlash checkpoint)."""
    if embedding:
        raise CheckpointError(
            f"{where}: a DFlash checkpoint holds no embedding",
            expected="saved_embedding=false",
            found="saved_embedding=true",
            fix="save it again without the embedding",
        )
    if contract.block is None:
        raise ContractMismatch(
            f"{where}: a DFlash draft needs block wiring in its contract",
            expected="contract.family='dflash'",
            found=f"family={contract.family!r}",
        )
    cfg.require_matches(contract)
    draft = DFlashDraft(cfg, contract).fill_nan()
    reference = draft.state_dict()
    _check_keys(set(reference), set(tensors), set(), where)
    floats = float_dtype or _float_dtype(tensors, where)
    for k, t in tensors.items():
        _check_tensor(k, t, reference[k], floats, where)
    require_finite(tensors, where, CheckpointError)
    if draft.reduced:
        check_vocab_tensors(tensors, cfg, contract, where)
    draft.to(getattr(torch, floats))
    own = draft.state_dict()
    with torch.no_grad():
        for k, t in tensors.items():
            own[k].copy_(t)
    if dtype is not None:
        draft.to(dtype)
    if target is not None:
        draft.attach_target(target.embedding(), target.head_rows())
    draft.contract = contract
    return draft.eval()


# The strict loader of each drafter family, called with load_strict's arguments: its record's part.
register_part("eagle3", "load_strict", load_strict)
register_part("dflash", "load_strict", load_dflash_strict)


def loader_for(contract: WiringContract) -> Callable[..., Any]:
    loader: Callable[..., Any] = get_family(contract.family).part("load_strict")
    return loader
