"""The reduced draft vocabulary: `d2t` offsets and the `t2d` mask, with their invariants.

    d2t: int64 [V_d]   offsets: target_id = draft_id + d2t[draft_id]   (never absolute ids)
    t2d: bool  [V]     t2d[target_id] is True iff target_id is in the draft vocabulary; sum == V_d

Draft ids are ordered by ascending target id (EAGLE, SpecForge and speculators all do so), which makes
`target_logits[..., t2d]` line up with the draft's lm_head rows. `validate_vocab_map` checks all of this
on build and on every load.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from eaglewire.errors import EaglewireError


DEFAULT_DRAFT_VOCAB = 16000  # half a 32k head's rows: a cheaper draft step on CPU; coverage is reported by vocab build


class VocabMapError(EaglewireError):
    """A d2t/t2d pair that breaks an invariant."""


def validate_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int) -> None:
    """Raise VocabMapError naming the broken invariant, the expected and the found value."""
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        raise VocabMapError(
            "d2t must be a 1-D int64 tensor of offsets", expected="int64 [V_d]", found=f"{d2t.dtype} {tuple(d2t.shape)}"
        )
    if t2d.dtype != torch.bool or t2d.shape != (vocab_size,):
        raise VocabMapError(
            "t2d must be a bool mask over the target vocabulary",
            expected=f"bool [{vocab_size}]",
            found=f"{t2d.dtype} {tuple(t2d.shape)}",
        )
    n_draft = d2t.numel()
    if int(t2d.sum()) != n_draft:
        raise VocabMapError(
            "t2d.sum() must equal the draft vocab size len(d2t)",
            expected=str(n_draft),
            found=str(int(t2d.sum())),
            fix="rebuild the vocab map (eaglewire vocab build)",
        )
    target_ids = torch.arange(n_draft, device=d2t.device) + d2t
    if n_draft and (int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab_size):
        raise VocabMapError(
            "d2t maps draft ids outside the target vocabulary",
            expected=f"i + d2t[i] in [0, {vocab_size})",
            found=f"range [{int(target_ids.min())}, {int(target_ids.max())}]",
            fix="d2t must hold OFFSETS (target - draft id), not absolute target ids",
        )
    if n_draft > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        raise VocabMapError(
            "draft ids must map to strictly ascending target ids",
            expected="i + d2t[i] strictly increasing",
            found="a decreasing or repeated target id (frequency-ordered map?)",
            fix="sort the kept target ids ascending before computing offsets",
        )
    if not bool(t2d[target_ids].all()):
        raise VocabMapError(
            "t2d and d2t disagree on which target ids are in the draft vocab",
            expected="t2d[i + d2t[i]] True for every draft id",
            found=f"{int((~t2d[target_ids]).sum())} mapped ids missing from t2d",
        )


@dataclass(frozen=True)
class VocabMap:
    d2t: torch.Tensor  # int64 [V_d] offsets
    t2d: torch.Tensor  # bool [V]

    def __post_init__(self) -> None:
        validate_vocab_map(self.d2t, self.t2d, self.t2d.numel())

    @property
    def draft_vocab_size(self) -> int:
        return self.d2t.numel()

    @property
    def vocab_size(self) -> int:
        return self.t2d.numel()

    @property
    def target_ids(self) -> torch.Tensor:  # int64 [V_d]
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    @classmethod
    def from_target_ids(cls, ids: torch.Tensor, vocab_size: int) -> "VocabMap":
        """Kept target ids (any order, unique) -> ascending map."""
        ids = torch.unique(ids.long())  # sorted ascending
        t2d = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
        t2d[ids] = True
        return cls(d2t=ids - torch.arange(ids.numel(), device=ids.device), t2d=t2d)

    @classmethod
    def identity(cls, vocab_size: int) -> "VocabMap":
        return cls.from_target_ids(torch.arange(vocab_size, device="cpu"), vocab_size)

    def sha256(self) -> str:
        return vocab_map_sha256(self.d2t, self.vocab_size)


def draft_index(t2d: torch.Tensor) -> torch.Tensor:
    """t2d bool [V] -> long [V]: the draft id of each kept target id (draft ids follow ascending target ids), -1
    for an id the draft vocabulary lacks. The inverse of target = i + d2t[i]."""
    return torch.where(t2d, t2d.long().cumsum(0) - 1, torch.full_like(t2d, -1, dtype=torch.long))


def vocab_map_sha256(d2t: torch.Tensor, vocab_size: int) -> str:
    """Identity of a vocab map: the target vocab size and the kept target ids (t2d follows from them)."""
    h = hashlib.sha256(f"V={vocab_size};".encode())
    h.update((torch.arange(d2t.numel(), device=d2t.device) + d2t).to("cpu", torch.int64).numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# Building from data
# --------------------------------------------------------------------------------------------------


def count_masked_tokens(samples, vocab_size: int) -> torch.Tensor:
    """int64 [V]: how often each target id is a trained (loss-masked) token."""
    counts = torch.zeros(vocab_size, dtype=torch.int64, device="cpu")  # host-side counting
    for s in samples:
        counts += torch.bincount(s.input_ids[s.loss_mask.bool()], minlength=vocab_size)
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    """Keep the V_d most frequent ids (ties by lower id), ordered by ascending target id."""
    if not 0 < draft_vocab_size <= counts.numel():
        raise VocabMapError(
            "draft vocab size out of range", expected=f"1 .. {counts.numel()}", found=str(draft_vocab_size)
        )
    # Stable descending sort keeps ascending id order among equal counts: ties go to the lower id.
    order = torch.sort(counts, descending=True, stable=True).indices
    return VocabMap.from_target_ids(order[:draft_vocab_size], counts.numel())


def grow_vocab_map(keep: VocabMap, counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    """`keep`'s ids plus the most frequent other ids (ties by lower id) up to V_d: a warm start's map
    widened, so every head row it trained stays and only the added rows start fresh."""
    if not keep.draft_vocab_size <= draft_vocab_size <= counts.numel():
        raise VocabMapError(
            "cannot grow the draft vocabulary to this size",
            expected=f"{keep.draft_vocab_size} (the kept map's size) .. {counts.numel()}",
            found=str(draft_vocab_size),
            fix="pass a --draft-vocab-size at least the warm start's",
        )
    others = counts.clone()
    others[keep.target_ids] = -1  # never picked twice: every real count is >= 0
    order = torch.sort(others, descending=True, stable=True).indices
    extra = order[: draft_vocab_size - keep.draft_vocab_size]
    return VocabMap.from_target_ids(torch.cat([keep.target_ids, extra]), counts.numel())


def coverage(vmap: VocabMap, counts: torch.Tensor) -> float:
    """Share of the counted tokens whose target id is inside the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[vmap.t2d].sum()) / total if total else float("nan")


def save_vocab(path, vmap: VocabMap, counts: torch.Tensor, meta: dict) -> None:
    import json

    from eaglewire.safeio import atomic_save_safetensors

    atomic_save_safetensors(
        {"d2t": vmap.d2t, "t2d": vmap.t2d, "counts": counts},
        path,
        metadata={"format": "eaglewire.vocab/1", "sha256": vmap.sha256(), "meta": json.dumps(meta)},
    )


def load_vocab(path) -> tuple[VocabMap, torch.Tensor, dict]:
    """Read and re-validate a vocab map (invariants and its recorded hash)."""
    import json

    from eaglewire.safeio import open_safetensors

    with open_safetensors(path, what="a vocab map", error=VocabMapError) as f:
        md = f.metadata()
        if md.get("format") != "eaglewire.vocab/1":
            raise VocabMapError(
                f"{path} is not an eaglewire vocab map",
                expected="format eaglewire.vocab/1",
                found=str(md.get("format")),
                fix="build one with `eaglewire vocab build`",
            )
        d2t, t2d, counts = f.get_tensor("d2t"), f.get_tensor("t2d"), f.get_tensor("counts")
    try:
        vmap = VocabMap(d2t=d2t, t2d=t2d)
    except VocabMapError as err:  # the same check, with the file named
        raise VocabMapError(f"{path}: {err.what}", expected=err.expected, found=err.found, fix=err.fix) from None
    if vmap.sha256() != md.get("sha256"):
        raise VocabMapError(
            f"{path}: vocab map does not match its recorded hash",
            expected=md.get("sha256"),
            found=vmap.sha256(),
            fix="rebuild it with `eaglewire vocab build`; it was altered",
        )
    try:
        meta = json.loads(md.get("meta", "{}"))
    except (json.JSONDecodeError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        raise VocabMapError(
            f"{path}: the 'meta' metadata is not a JSON object",
            expected="a JSON object",
            found=repr(md.get("meta"))[:80],
            fix="rebuild it with `eaglewire vocab build`",
        )
    return vmap, counts, meta
