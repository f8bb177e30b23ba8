"""Target features for training: online (target runs inside training) or offline (sharded safetensors).

Offline layout (`eaglewire data capture`):
    DIR/manifest.json        {"format", "contract", "shards": [...], "tokens", "tap_stats": {mean, std}}
    DIR/shard-00000.safetensors
        input_ids int64 [N], loss_mask int64 [N], offsets int64 [S+1] (sample k = [offsets[k], offsets[k+1]))
        taps [N, n*H] and final_hidden [N, H] (the target's final-norm state; logits = lm_head(final_hidden)),
            stored in bf16 by default (2 bytes a channel; the loss reads them back in fp32)
        target_top1 int32 [N]  the target's argmax at each position, in the dtype the target ran in (training
            masks positions whose top-1 the draft vocab lacks; storing it spares training the full V-wide
            head: it then needs only the V_d head rows). Bytes per token, 3 taps of H=576, bf16:
            3456 + 1152 + 4 + 16 = 4628.
        stat_sum / stat_sumsq float64 [n*H]  (per-channel sums over this shard, for the tap fingerprint)
        metadata: contract fingerprint, sample ids
Shard k always holds samples [k*S, (k+1)*S) of the deterministic sample order; each is written to a
temp name and renamed, so a killed capture resumes at the first missing shard. A shard or manifest
made for another contract is refused, naming the differing fields. The directory's manifest and the shard
loop that writes it are feature_dir.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from eaglewire.contract import WiringContract
from eaglewire.families import DEFAULT_FAMILY
from eaglewire.norms import NormFlags
from eaglewire.data.samples import Sample
from eaglewire.errors import ContractMismatch
from eaglewire.safeio import open_safetensors
from eaglewire.capture.feature_dir import read_manifest, write_feature_dir
from eaglewire.capture.hooks import capture
from eaglewire.capture.shards import check_feature_dir, shard_sample_ids
from eaglewire.target.loader import Target

_ROW_KEYS = ("input_ids", "loss_mask", "taps", "final_hidden", "target_top1")  # per-token tensors of a shard
DEFAULT_STORE_DTYPE = torch.bfloat16  # half the bytes of fp32; top-1 agreement of the draft unchanged (README)


@dataclass
class FeatureBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    loss_mask: torch.Tensor  # [B, T] 1 on trained tokens
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    taps: torch.Tensor  # [B, T, n*H_t]
    final_hidden: torch.Tensor  # [B, T, H_t] target final-norm hidden (logits = lm_head of it)
    target_top1: torch.Tensor | None = None  # [B, T] the target's argmax token (stored at capture), or None

    def to(self, device: torch.device | str) -> "FeatureBatch":
        return FeatureBatch(
            *(
                t.to(device) if t is not None else None
                for t in (
                    self.input_ids,
                    self.loss_mask,
                    self.attention_mask,
                    self.taps,
                    self.final_hidden,
                    self.target_top1,
                )
            )
        )


def features_view(contract: WiringContract) -> WiringContract:
    """The part of a contract features depend on: target, taps, capture point, chat template —
    not the vocab map, the draft's norm flags or its family (EAGLE-3 or a block drafter), which are chosen
    after capture: one feature directory trains any family that reads its taps."""
    return dataclasses.replace(
        contract, draft_vocab_size=None, vocab_map_sha256=None, norm=NormFlags(), family=DEFAULT_FAMILY, block=None
    )


def collate(samples: list[Sample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sample: (input_ids, loss_mask, attention_mask), each [B, T], on the host."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long, device="cpu")
    loss = torch.zeros(len(samples), width, dtype=torch.long, device="cpu")
    attn = torch.zeros(len(samples), width, dtype=torch.long, device="cpu")
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n], loss[i, :n], attn[i, :n] = s.input_ids, s.loss_mask, 1
    return ids, loss, attn


class OnlineFeatures:
    """Runs the target on each batch (no disk; costs one target forward per batch per epoch)."""

    stores_target_top1 = False  # batches bring no top-1: training computes it with the full head

    def __init__(self, target: Target, contract: WiringContract, pad_id: int) -> None:
        self.target, self.contract, self.pad_id = target, contract, pad_id

    def batch(self, samples: list[Sample]) -> FeatureBatch:
        ids, loss, attn = collate(samples, self.pad_id)
        dev = self.target.device  # where the target reads its inputs (the first GPU of a spread target)
        cap = capture(self.target, self.contract.taps, ids.to(dev), attn.to(dev))
        return FeatureBatch(ids, loss, attn, cap.taps, cap.final_hidden)


def target_top1(head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The target's argmax token at each position: head [V, H] x hidden [T, H] -> [T] int32.

    In the target's own dtype: the full-vocab argmax costs a quarter of a 135M target's forward in fp32, and a
    bf16 target's top-1 is its bf16 logits' argmax anyway. 512 rows at a time bound the [512, V] logits."""
    hidden = hidden.to(head.dtype)
    return torch.cat([(h @ head.T).argmax(-1) for h in hidden.split(512)]).to(torch.int32)


def pack_rows(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-sample rows (the _ROW_KEYS, each [T_k, ...]) -> one shard's tensors, with offsets and tap sums."""
    out = {k: torch.cat([row[k] for row in rows]) for k in _ROW_KEYS}
    lengths = torch.tensor([len(row["input_ids"]) for row in rows])
    out["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    taps64 = out["taps"].double()  # [N, n*H]
    out["stat_sum"], out["stat_sumsq"] = taps64.sum(0), (taps64**2).sum(0)
    return out


def capture_shard(
    target: Target, contract: WiringContract, samples: list[Sample], pad_id: int, batch_size: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    online = OnlineFeatures(target, contract, pad_id)
    head = target.model.get_output_embeddings().weight.detach()  # [V, H] in the target's own dtype
    rows: list[dict[str, torch.Tensor] | None] = [None] * len(samples)
    # Batches of similar length (sorted), rows stored back in sample order: padding a short sample to a
    # long neighbour spends target forwards on padding, and chat data's lengths vary widely.
    order = sorted(range(len(samples)), key=lambda j: len(samples[j].input_ids))
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        fb = online.batch([samples[j] for j in idx])
        for r, j in enumerate(idx):
            n = len(samples[j].input_ids)  # right padding: the first n positions are real
            hid = fb.final_hidden[r, :n]
            # computed where the target ran, stored from the CPU (shards are host files)
            rows[j] = {
                "input_ids": fb.input_ids[r, :n],
                "loss_mask": fb.loss_mask[r, :n],
                "taps": fb.taps[r, :n].to("cpu", dtype),
                "final_hidden": hid.to("cpu", dtype),
                "target_top1": target_top1(head, hid.to(head.device)).cpu(),
            }  # before storage
    return pack_rows(rows)


def capture_features(
    target: Target,
    contract: WiringContract,
    samples: list[Sample],
    out: Path,
    *,
    pad_id: int,
    shard_samples: int = 256,
    batch_size: int = 4,
    dtype: torch.dtype = DEFAULT_STORE_DTYPE,
    on_shard: Callable[[int, int, int], None] | None = None,
) -> dict:
    """Write (or resume) offline feature shards and the manifest; returns the manifest."""

    def build(k: int, _ids: list[str]) -> dict[str, torch.Tensor]:
        chunk = samples[k * shard_samples : (k + 1) * shard_samples]
        return capture_shard(target, contract, chunk, pad_id, batch_size, dtype)

    # The dtype the target ran in is part of what the shards hold (bf16 taps differ from fp32 ones by
    # ~0.5% relative): a directory never mixes the two.
    target_dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    return write_feature_dir(
        Path(out),
        features_view(contract),
        [s.id for s in samples],
        build,
        shard_samples=shard_samples,
        target_dtype=target_dtype,
        store_dtype=dtype,
        on_shard=on_shard,
    )


def captured_taps(directory: Path, requested: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The taps (boundaries) the features in `directory` were captured at, from its manifest. A
    `requested` tap list (an explicit --taps) must be the same: features hold no other boundary."""
    taps = tuple(read_manifest(directory)["contract"]["taps"])
    if requested is not None and tuple(requested) != taps:
        raise ContractMismatch(
            f"features in {directory} were captured for another wiring contract (taps differ)",
            expected=f"taps {list(requested)} (boundaries, from --taps)",
            found=f"taps {list(taps)} (the features' manifest)",
            fix="drop --taps (the manifest's are used), or capture features at these taps",
        )
    return taps


class OfflineFeatures:
    """Serves FeatureBatches from shards; refuses shards made for another contract."""

    def __init__(
        self, directory: Path, contract: WiringContract, pad_id: int, max_cached_shards: int | None = None
    ) -> None:
        self.dir, self.pad_id = Path(directory), pad_id
        manifest = read_manifest(self.dir)
        self.view = features_view(contract)
        self.view.require_compatible(
            WiringContract.from_dict(manifest["contract"]), where=f"features in {self.dir / 'manifest.json'}"
        )
        self.manifest = manifest
        # every shard checked against the manifest before a batch is drawn: the reader `data inspect` uses too
        shards = check_feature_dir(self.dir, manifest, self.view.fingerprint(), len(self.view.taps))
        self.stores_target_top1 = all(s.has_top1 for s in shards)  # then training needs V_d head rows only
        self.index: dict[str, tuple[int, int]] = {
            sid: (k, j) for k, s in enumerate(shards) for j, sid in enumerate(s.sample_ids)
        }
        # Batches draw samples from random shards, so shards stay in memory once read (a few GB on CPU
        # runs); `max_cached_shards` bounds that for large captures (least recently used are dropped).
        self._cache: dict[int, dict[str, torch.Tensor]] = {}
        self.max_cached_shards = max_cached_shards

    def _shard(self, k: int) -> dict[str, torch.Tensor]:
        if k not in self._cache:
            if self.max_cached_shards is not None and len(self._cache) >= self.max_cached_shards:
                self._cache.pop(next(iter(self._cache)))
            with open_safetensors(
                self.dir / self.manifest["shards"][k]["file"], what="a feature shard", error=ContractMismatch
            ) as f:
                # target_top1 is absent from shards captured before it was stored (training then
                # computes it from the full head: same result, slower)
                self._cache[k] = {n: f.get_tensor(n) for n in (*_ROW_KEYS, "offsets") if n in f.keys()}
        else:
            self._cache[k] = self._cache.pop(k)  # most recently used last
        return self._cache[k]

    def sample_ids(self) -> list[str]:
        return list(self.index)

    def samples(self) -> list[Sample]:
        """The captured samples themselves (tokens and loss masks come from the shards)."""
        out = []
        for k, sh in enumerate(self.manifest["shards"]):
            with open_safetensors(self.dir / sh["file"], what="a feature shard", error=ContractMismatch) as f:
                ids, mask, off = f.get_tensor("input_ids"), f.get_tensor("loss_mask"), f.get_tensor("offsets")
                names = shard_sample_ids(f.metadata(), self.dir / sh["file"])
            out += [Sample(n, ids[off[j] : off[j + 1]], mask[off[j] : off[j + 1]]) for j, n in enumerate(names)]
        return out

    def rows(self, samples: list[Sample]) -> list[dict[str, torch.Tensor]]:
        """Each sample's per-token tensors, as stored (bf16 taps stay bf16 until collation)."""
        rows = []
        for s in samples:
            k, j = self.index[s.id]
            sh = self._shard(k)
            a, b = int(sh["offsets"][j]), int(sh["offsets"][j + 1])
            rows.append({n: sh[n][a:b] for n in _ROW_KEYS if n in sh})
        return rows

    def batch(self, samples: list[Sample]) -> FeatureBatch:
        return collate_rows(self.rows(samples), self.pad_id)


def collate_rows(rows: list[dict[str, torch.Tensor]], pad_id: int) -> FeatureBatch:
    """Stored rows -> one right-padded FeatureBatch (taps and final state back in fp32 for the loss)."""
    ids, loss, attn = collate([Sample("", r["input_ids"], r["loss_mask"]) for r in rows], pad_id)
    B, T = ids.shape
    taps = torch.zeros(B, T, rows[0]["taps"].shape[-1])  # [B, T, n*H_t]
    hid = torch.zeros(B, T, rows[0]["final_hidden"].shape[-1])  # [B, T, H_t]
    top1 = torch.zeros(B, T, dtype=torch.long) if all("target_top1" in r for r in rows) else None
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        taps[i, :n], hid[i, :n] = r["taps"].float(), r["final_hidden"].float()
        if top1 is not None:
            top1[i, :n] = r["target_top1"].long()
    return FeatureBatch(ids, loss, attn, taps, hid, top1)


class FeatureMix:
    """A primary feature directory plus extra ones of the same contract and target dtype, served as one.

    The primary's sample ids are kept as they are (its held-out split is unchanged); the extras' get a
    `+N/` prefix (N = their position), so ids of two directories never collide. What is held out and
    what trains is the caller's choice (`eaglewire train`: held-out from the primary only)."""

    def __init__(self, primary: OfflineFeatures, extras: list[OfflineFeatures]) -> None:
        for e in extras:
            for key in ("target_dtype", "store_dtype"):
                if e.manifest.get(key) != primary.manifest.get(key):
                    raise ContractMismatch(
                        f"features in {e.dir} and {primary.dir} differ in {key}",
                        expected=str(primary.manifest.get(key)),
                        found=str(e.manifest.get(key)),
                        fix="capture the extra directory with the same --target-dtype/--store-dtype",
                    )
        self.parts, self.pad_id = [primary, *extras], primary.pad_id
        self.stores_target_top1 = all(p.stores_target_top1 for p in self.parts)

    @staticmethod
    def _split(sid: str) -> tuple[int, str]:
        if sid.startswith("+") and "/" in sid:
            n, rest = sid[1:].split("/", 1)
            return int(n), rest
        return 0, sid

    def samples(self, part: int) -> list[Sample]:
        prefix = f"+{part}/" if part else ""
        return [Sample(prefix + s.id, s.input_ids, s.loss_mask) for s in self.parts[part].samples()]

    def batch(self, samples: list[Sample]) -> FeatureBatch:
        rows = []
        for s in samples:
            part, sid = self._split(s.id)
            rows += self.parts[part].rows([Sample(sid, s.input_ids, s.loss_mask)])
        return collate_rows(rows, self.pad_id)
