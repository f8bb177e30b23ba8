"""The one check of a feature directory against its manifest, shared by every reader of it (`train`'s
OfflineFeatures, `data inspect`): a shard that is missing, extra, cut, edited, of another width or whose
sample ids, offsets and token counts disagree is refused naming the shard, before a batch is drawn.

Each check reads the safetensors header (shapes, dtypes, metadata) and the small `offsets` tensor only, so
checking a directory costs a few kB per shard, not its gigabytes; the per-shard digest the manifest records
(size plus a sampled hash, `digests.sampled_digest`) catches a replaced or edited file of the same layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewire.errors import ContractMismatch
from eaglewire.digests import sampled_digest
from eaglewire.safeio import GuardedSafetensors, damaged, open_safetensors

WHAT = "a feature shard"
SHARD_GLOB = "shard-*.safetensors"
_FIX = "capture the features again into a new --out (eaglewire data capture), or restore the directory from a copy"
_INT = {"I64", "I32", "I16", "I8", "U8", "BOOL"}
_FLOAT = {"F32", "F16", "BF16", "F64"}
# tensor -> (rank, dtype kinds): per-token tensors have N rows; offsets has S+1 entries
_LAYOUT: dict[str, tuple[int, set[str]]] = {
    "input_ids": (1, _INT),
    "loss_mask": (1, _INT),
    "target_top1": (1, _INT),
    "offsets": (1, {"I64", "I32"}),
    "taps": (2, _FLOAT),
    "final_hidden": (2, _FLOAT),
}
_OPTIONAL = {"target_top1"}  # absent in shards captured before it was stored


@dataclass(frozen=True)
class ShardInfo:
    """What one checked shard holds (from its header and offsets)."""

    file: str
    sample_ids: list[str]
    tokens: int
    hidden: int  # H: final_hidden's width; taps are num_taps * H wide
    has_top1: bool


def shard_sample_ids(md: dict[str, str], path: Path) -> list[str]:
    """A shard's sample ids (its metadata): a JSON list of strings, or a clear error naming the shard."""
    try:
        ids = json.loads(md.get("sample_ids", "[]"))
    except (json.JSONDecodeError, RecursionError):
        ids = None
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise _refuse(path, "metadata 'sample_ids': a JSON list of strings", repr(md.get("sample_ids"))[:80])
    return ids


def _refuse(path: Path, expected: str, found: str) -> Exception:
    return damaged(path, WHAT, expected, found, _FIX, ContractMismatch)


def check_feature_dir(directory: Path, manifest: dict[str, Any], fingerprint: str, num_taps: int) -> list[ShardInfo]:
    """Every shard the manifest lists, checked (see `check_shard`), no other shard file in the directory, the
    totals and the width the same across shards, each sample id once."""
    directory = Path(directory)
    listed = [sh["file"] for sh in manifest["shards"]]
    if len(set(listed)) != len(listed):
        dup = next(n for n in listed if listed.count(n) > 1)
        raise _refuse(directory / "manifest.json", "each shard listed once", f"{dup} listed {listed.count(dup)} times")
    extra = sorted(p.name for p in directory.glob(SHARD_GLOB) if p.name not in set(listed))
    if extra:
        raise ContractMismatch(
            f"{directory}: shard file(s) the manifest does not list: {', '.join(extra[:4])}",
            expected=f"exactly the manifest's {len(listed)} shard(s)",
            found=f"{len(extra)} more: {extra[:4]}",
            fix="move the extra shards out (another capture's?), or capture again into a new --out",
        )
    infos = [check_shard(directory / sh["file"], sh, fingerprint, num_taps) for sh in manifest["shards"]]
    _check_across(directory, manifest, infos)
    return infos


def _check_across(directory: Path, manifest: dict[str, Any], infos: list[ShardInfo]) -> None:
    where = directory / "manifest.json"
    for key, got in (("samples", sum(len(i.sample_ids) for i in infos)), ("tokens", sum(i.tokens for i in infos))):
        if key in manifest and manifest[key] != got:
            raise _refuse(where, f"{key}: {got} (the sum over its shards)", f"{key}: {manifest[key]!r}")
    widths = {i.hidden for i in infos}
    if len(widths) > 1:
        odd = next(i for i in infos if i.hidden != infos[0].hidden)
        raise _refuse(
            directory / odd.file, f"hidden width {infos[0].hidden} (as {infos[0].file})", f"hidden width {odd.hidden}"
        )
    seen: dict[str, str] = {}
    for i in infos:
        for sid in i.sample_ids:
            if sid in seen:
                raise _refuse(
                    directory / i.file,
                    "each sample id once in the directory",
                    f"sample id {sid!r}"[:120] + f" also in {seen[sid]}",
                )
            seen[sid] = i.file


def check_shard(path: Path, entry: dict[str, Any], fingerprint: str, num_taps: int) -> ShardInfo:
    """One shard against its manifest entry: there, the recorded digest (when the manifest has one), its
    contract, its tensors' ranks, dtypes and lengths, offsets from 0 rising to N, sample ids and counts."""
    if not path.is_file():
        raise _refuse(
            path,
            f"the shard {path.name} the manifest lists",
            "no such file" if not path.exists() else "not a regular file",
        )
    if "digest" in entry and sampled_digest(path) != entry["digest"]:
        raise _refuse(
            path,
            f"the shard manifest.json records (size:sampled sha256 {entry['digest'][:40]}...)",
            f"another file ({sampled_digest(path)[:40]}...): the shard (or manifest.json's record of "
            "it) was edited, cut or replaced since capture",
        )
    with open_safetensors(path, what=WHAT, error=ContractMismatch) as f:
        md = f.metadata()
        if md.get("contract") != fingerprint:
            raise ContractMismatch(
                f"{path} was captured for another wiring contract than its manifest.json and this command name",
                expected=f"contract {fingerprint}",
                found=f"contract {md.get('contract')} (the shard's metadata)",
                fix="point --features at features captured for this contract; if "
                "manifest.json was edited, restore it or capture again",
            )
        shapes = _shapes(f, path)
        offsets = f.get_tensor("offsets").long().tolist()
    ids = shard_sample_ids(md, path)
    n = shapes["input_ids"][0]
    _check_rows(path, shapes, n, num_taps)
    _check_offsets(path, offsets, n, len(ids))
    if len(ids) != entry["samples"] or n != entry["tokens"]:
        raise _refuse(
            path,
            f"{entry['samples']} samples, {entry['tokens']} tokens (the manifest's entry)",
            f"{len(ids)} samples, {n} tokens",
        )
    return ShardInfo(path.name, ids, n, shapes["final_hidden"][1], "target_top1" in shapes)


def _shapes(f: GuardedSafetensors, path: Path) -> dict[str, list[int]]:
    """{tensor: shape} of the shard's tensors, each of the rank and dtype kind _LAYOUT names."""
    keys = set(f.keys())
    missing = sorted(set(_LAYOUT) - _OPTIONAL - keys)
    if missing:
        raise _refuse(path, f"tensors {sorted(set(_LAYOUT) - _OPTIONAL)}", f"{missing} missing")
    shapes = {}
    for name in sorted(set(_LAYOUT) & keys):
        rank, kinds = _LAYOUT[name]
        sl = f.get_slice(name)
        shape, dtype = list(sl.get_shape()), sl.get_dtype()
        if len(shape) != rank or dtype not in kinds:
            raise _refuse(path, f"{name}: {rank}-D, dtype one of {sorted(kinds)}", f"{name}: {shape} {dtype}")
        shapes[name] = shape
    return shapes


def _check_rows(path: Path, shapes: dict[str, list[int]], n: int, num_taps: int) -> None:
    for name, shape in shapes.items():
        if name != "offsets" and shape[0] != n:
            raise _refuse(path, f"{name}: {n} rows (one per token, as input_ids)", f"{name}: {shape[0]} rows")
    width, h = shapes["taps"][1], shapes["final_hidden"][1]
    if h < 1 or width != num_taps * h:
        raise _refuse(
            path,
            f"taps {num_taps} x {h} = {num_taps * h} wide (the contract's {num_taps} taps of the "
            f"hidden width, final_hidden's)",
            f"taps {width} wide, final_hidden {h}",
        )


def _check_offsets(path: Path, offsets: list[int], n: int, samples: int) -> None:
    if len(offsets) != samples + 1:
        raise _refuse(
            path,
            f"offsets of {samples + 1} entries (one per sample id, plus one)",
            f"{len(offsets)} offsets for {samples} sample ids",
        )
    if offsets[0] != 0 or offsets[-1] != n or any(b < a for a, b in zip(offsets, offsets[1:])):
        bad = next((k for k, (a, b) in enumerate(zip(offsets, offsets[1:])) if b < a), None)
        raise _refuse(
            path,
            f"offsets rising from 0 to {n} (the shard's tokens)",
            f"offsets {offsets[0]} .. {offsets[-1]}" + (f", falling after entry {bad}" if bad is not None else ""),
        )
