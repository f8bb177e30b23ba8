"""A feature directory on disk (the layout is features.py's): its manifest, every field checked before use
(`read_manifest`), and the shard loop every producer of shards shares (`write_feature_dir`: `capture_features`
and the dump importer), with its resume rules: whole shards of the same contract are kept, an edited one is
written again, stale ones of an earlier run are removed, and the manifest comes last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from eaglewire.contract import WiringContract
from eaglewire.digests import sampled_digest
from eaglewire.errors import ContractMismatch
from eaglewire.safeio import (
    about_file,
    atomic_save_safetensors,
    atomic_write_json,
    field_of,
    open_safetensors,
    read_json_object,
)
from eaglewire.capture.shards import SHARD_GLOB, shard_sample_ids

FORMAT = "eaglewire.features/1"


def write_feature_dir(
    out: Path,
    view: WiringContract,
    sample_ids: list[str],
    build: Callable[[int, list[str]], dict[str, torch.Tensor]],
    *,
    shard_samples: int,
    target_dtype: str,
    store_dtype: torch.dtype,
    on_shard: Callable[[int, int, int], None] | None = None,
    extra: dict | None = None,
) -> dict:
    """The shard loop and manifest every producer of feature shards shares (capture, dump import).

    `build(k, ids)` returns shard k's tensors (`pack_rows`); shards already on disk for the same ids and
    contract are kept, each new one is written to a temp name and renamed, and the manifest comes last, so
    a killed or failed run leaves only whole shards and resumes at the first missing one. `extra` adds
    keys to the manifest (an import's source)."""
    fp = view.fingerprint()
    digests = _recorded_digests(out, view, target_dtype)
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    n_shards = (len(sample_ids) + shard_samples - 1) // shard_samples
    for k in range(n_shards):
        ids = sample_ids[k * shard_samples : (k + 1) * shard_samples]
        shards.append(_shard_entry(out, k, ids, fp, digests, build))
        if on_shard:
            on_shard(k + 1, n_shards, shards[-1]["tokens"])
    _drop_stale_shards(out, n_shards, fp)
    manifest = {
        "format": FORMAT,
        "contract": view.to_dict(),
        "shards": shards,
        "target_dtype": target_dtype,
        "store_dtype": str(store_dtype).removeprefix("torch."),
        "tokens": sum(s["tokens"] for s in shards),
        "samples": len(sample_ids),
        "tap_stats": _tap_stats(out, shards, view.taps),
        **(extra or {}),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


def _recorded_digests(out: Path, view: WiringContract, target_dtype: str) -> dict[str, str]:
    """{shard file: digest} an earlier run's manifest in `out` recorded ({} when there is none): a reused shard
    must still have it. That run must have been of the same contract and target dtype, or nothing is reused."""
    if not (out / "manifest.json").exists():
        return {}
    old = read_manifest(out)
    view.require_compatible(WiringContract.from_dict(old["contract"]), where=f"features in {out / 'manifest.json'}")
    if old.get("target_dtype", "float32") != target_dtype:
        raise ContractMismatch(
            f"features in {out} were captured with the target in another dtype",
            expected=old.get("target_dtype", "float32"),
            found=target_dtype,
            fix="capture into a new --out, or load the target in the same dtype",
        )
    return {sh["file"]: sh["digest"] for sh in old["shards"] if "digest" in sh}


def _shard_entry(
    out: Path,
    k: int,
    ids: list[str],
    fingerprint: str,
    digests: dict[str, str],
    build: Callable[[int, list[str]], dict[str, torch.Tensor]],
) -> dict:
    """Shard k of `ids`, kept when whole on disk, else built and written; its manifest entry."""
    path = _shard_path(out, k)
    recorded = digests.get(path.name)  # a shard changed since it was recorded is captured again
    if not _shard_ok(path, fingerprint, ids) or recorded is not None and sampled_digest(path) != recorded:
        metadata = {"format": FORMAT, "contract": fingerprint, "sample_ids": json.dumps(ids)}
        atomic_save_safetensors(build(k, ids), path, metadata)
    with open_safetensors(path, what="a feature shard", error=ContractMismatch) as f:
        tokens = int(f.get_tensor("offsets")[-1])
    return {"file": path.name, "samples": len(ids), "tokens": tokens, "digest": sampled_digest(path)}


def _shard_path(out: Path, k: int) -> Path:
    return out / f"shard-{k:05d}.safetensors"


def _shard_ok(path: Path, fingerprint: str, ids: list[str]) -> bool:
    if not path.exists():
        return False
    with open_safetensors(path, what="a feature shard", error=ContractMismatch) as f:
        md = f.metadata()
    if md.get("contract") != fingerprint:
        raise ContractMismatch(
            f"{path} was captured for another wiring contract",
            expected=f"contract {fingerprint}",
            found=f"contract {md.get('contract')}",
            fix="capture into a new --out directory",
        )
    return shard_sample_ids(md, path) == ids


def _drop_stale_shards(out: Path, n_shards: int, fingerprint: str) -> None:
    """Shards past the last one of this capture: a re-capture of fewer samples into the same --out leaves its
    earlier run's tail, which readers would refuse as unlisted. Those this contract's captures wrote are
    removed (this command's own earlier output); any other shard file is refused, never deleted."""
    for path in sorted(out.glob(SHARD_GLOB)):
        if path.name in {_shard_path(out, k).name for k in range(n_shards)}:
            continue
        with open_safetensors(path, what="a feature shard", error=ContractMismatch) as f:
            md = f.metadata()
        if md.get("format") != FORMAT or md.get("contract") != fingerprint:
            raise ContractMismatch(
                f"{out} holds a shard file this capture did not write: {path.name}",
                expected=f"shard-00000 .. shard-{n_shards - 1:05d} of contract {fingerprint}",
                found=f"{path.name} (format {md.get('format')}, contract {md.get('contract')})",
                fix="move it out, or capture into a new --out",
            )
        path.unlink()


def _tap_stats(out: Path, shards: list[dict], taps: tuple[int, ...]) -> dict:
    """Per-tap, per-channel mean/std over every captured token: the doctor's fingerprint of the wiring."""
    total, s1, s2 = 0, None, None
    for sh in shards:
        with open_safetensors(out / sh["file"], what="a feature shard", error=ContractMismatch) as f:
            a, b = f.get_tensor("stat_sum"), f.get_tensor("stat_sumsq")
        s1, s2 = (a, b) if s1 is None else (s1 + a, s2 + b)
        total += sh["tokens"]
    mean = s1 / total
    std = (s2 / total - mean**2).clamp(min=0).sqrt()
    n = len(taps)
    return {
        "taps": list(taps),
        "tokens": total,
        "mean": [c.tolist() for c in mean.float().chunk(n)],
        "std": [c.tolist() for c in std.float().chunk(n)],
    }


def read_manifest(directory: Path) -> dict:
    """The manifest of a `data capture` directory (format checked)."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise ContractMismatch(
            f"{directory} is not an eaglewire feature directory",
            expected=f"{path} ({FORMAT})",
            found="no manifest.json",
            fix="point --features at the --out of `data capture`",
        )
    manifest = read_json_object(path, what="a feature manifest", error=ContractMismatch)
    if manifest.get("format") != FORMAT:
        raise ContractMismatch(
            f"{directory} is not an eaglewire feature directory", expected=FORMAT, found=str(manifest.get("format"))
        )
    where = str(path)
    field_of(manifest, "contract", dict, where=where, error=ContractMismatch)
    with about_file(path):
        WiringContract.from_dict(manifest["contract"])  # its fields and their types, before anything uses them
    for sh in field_of(manifest, "shards", list, where=where, error=ContractMismatch):
        field_of({"shard": sh}, "shard", dict, where=f"{where}: shards", error=ContractMismatch)
        name = field_of(sh, "file", str, where=f"{where}: shards", error=ContractMismatch)
        if Path(name).name != name or not name.endswith(".safetensors"):  # a shard lives in the directory
            raise ContractMismatch(
                f"{where}: a shard file name that leaves the feature directory",
                expected="a plain file name like shard-00000.safetensors",
                found=repr(name),
                fix="capture the features again (eaglewire data capture)",
            )
        for key in ("samples", "tokens"):
            if field_of(sh, key, int, where=f"{where}: shards", error=ContractMismatch) < 0:
                raise ContractMismatch(
                    f"{where}: a shard with a negative {key} count",
                    expected=f"{key} >= 0",
                    found=str(sh[key]),
                    fix="capture the features again",
                )
        if "digest" in sh:  # manifests written before digests were recorded have none
            field_of(sh, "digest", str, where=f"{where}: shards", error=ContractMismatch)
    return manifest
