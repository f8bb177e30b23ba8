"""A hidden-state dump of every boundary: the measured wiring check for targets too large to load here.

`eaglewire doctor sample --target T --out FILE` runs where the target runs (the GPU box that serves it)
and writes the Boundaries the measured check scores drafts on (capture/boundaries.py) to one safetensors
file; `eaglewire doctor check DIR --boundaries FILE` then measures anywhere, without the target.

Besides the states the check needs little from the target: its identity and sizes (the file's metadata)
and the embedding rows of the tokens the draft reads. Those rows ARE boundary 0 of the dump (the input
to decoder layer 0) for a target whose layer 0 reads the plain embedding lookup; `capture_dump` checks
that on the target before writing. `DumpTarget` is the stand-in built from the file: its embedding rows
of tokens the dump does not hold are NaN, and run_measurement requires every row it reads to be finite,
so such a row can never be used silently.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, TypeGuard

import torch

from eaglewire.contract import TargetIdentity, WiringContract, sha256_text
from eaglewire.norms import NormFlags
from eaglewire.capture.boundaries import Boundaries, sample_target
from eaglewire.errors import EaglewireError
from eaglewire.safeio import atomic_save_safetensors, check_dataclass_fields, open_safetensors
from eaglewire.target.protocol import RunnableTarget, TargetInfo

FORMAT = "eaglewire.boundaries/1"
TENSORS = {"states": "a float", "input_ids": "torch.int64", "labels": "torch.int64", "scored": "torch.bool"}
# Optional (`doctor sample --vocab`): the target's whole input embedding and output head [V, H]. A block
# drafter (DFlash) embeds a mask token no text holds and predicts through the target's head, so its
# measurement on a dump needs both; an EAGLE-3 draft needs neither (its own head, boundary 0's rows).
VOCAB = ("embedding", "head")
RECAPTURE = "re-capture it where the target runs: eaglewire doctor sample --target T --out FILE"


def save_boundaries(
    bounds: Boundaries,
    path: Path,
    identity: TargetIdentity,
    *,
    chat_template_sha256: str | None = None,
    vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Path:
    """Write `bounds` (states in the dtype given: bf16 halves a big target's file) with the target's identity;
    `vocab`: the target's (embedding, head), each [V, H], for block drafters."""
    _validate(bounds, identity, f"boundaries for {path}")  # never write a file load_boundaries refuses
    meta = {
        "format": FORMAT,
        "target": json.dumps(asdict(identity), sort_keys=True),
        "chat_template_sha256": json.dumps(chat_template_sha256),
    }
    tensors = {"states": bounds.states, "input_ids": bounds.input_ids, "labels": bounds.labels, "scored": bounds.scored}
    if vocab is not None:
        tensors.update(zip(VOCAB, (v.detach().to(bounds.states.dtype) for v in vocab)))
        _validate_vocab(tensors, identity, f"boundaries for {path}")
    atomic_save_safetensors({k: v.cpu() for k, v in tensors.items()}, Path(path), metadata=meta)
    return Path(path)


def load_boundaries(path: Path) -> tuple[Boundaries, TargetIdentity]:
    """The Boundaries and target identity `save_boundaries` wrote, validated (a damaged file is refused)."""
    bounds, identity, _ = load_dump(path)
    return bounds, identity


def load_dump(path: Path) -> tuple[Boundaries, TargetIdentity, str | None]:
    """(Boundaries, identity, the target's chat-template sha256 or None) from a dump file."""
    path = Path(path)
    if not path.is_file():
        raise EaglewireError(
            f"boundaries dump {path} does not exist",
            expected="a file from eaglewire doctor sample",
            found="no such file",
            fix=RECAPTURE,
        )
    with open_safetensors(path, what="a boundaries dump") as f:
        meta, keys = f.metadata(), set(f.keys())
        tensors = {k: f.get_tensor(k) for k in keys & set(TENSORS)}
        vocab = {k: f.get_tensor(k) for k in keys & set(VOCAB)}
    if meta.get("format") != FORMAT:
        raise EaglewireError(
            f"{path} is not a boundaries dump",
            expected=f"metadata format {FORMAT!r}",
            found=f"format {meta.get('format')!r}",
            fix=RECAPTURE,
        )
    if keys not in (set(TENSORS), set(TENSORS) | set(VOCAB)):
        raise EaglewireError(
            f"{path} has the wrong set of tensors",
            expected=f"{sorted(TENSORS)}, and {list(VOCAB)} together or neither",
            found=f"missing {sorted(set(TENSORS) - keys)}, unexpected {sorted(keys - set(TENSORS))}",
            fix=RECAPTURE,
        )
    identity = _identity(meta, path)
    bounds = Boundaries(**tensors)
    _validate(bounds, identity, str(path))
    _validate_vocab(vocab, identity, str(path))
    raw = meta.get("chat_template_sha256", "null")
    try:
        sha = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        sha = ...  # neither a string nor null: refused below
    if not (sha is None or isinstance(sha, str)):
        raise EaglewireError(
            f"{path}: metadata 'chat_template_sha256' is damaged",
            expected="a JSON string or null",
            found=repr(raw)[:80],
            fix=RECAPTURE,
        )
    return bounds, identity, sha


def load_vocab(path: Path) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The target's (embedding, head) a dump holds (`doctor sample --vocab`), None where it holds neither;
    call after load_dump, which validates them."""
    with open_safetensors(Path(path), what="a boundaries dump") as f:
        if not set(VOCAB) <= set(f.keys()):
            return None
        emb, head = (f.get_tensor(k) for k in VOCAB)
    return emb, head


def _validate_vocab(vocab: dict[str, torch.Tensor], ident: TargetIdentity, where: str) -> None:
    want = (ident.vocab_size, ident.hidden_size)
    for name in set(VOCAB) & set(vocab):
        t = vocab[name]
        if tuple(t.shape) != want or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise EaglewireError(
                f"{where}: the target's {name} is damaged",
                expected=f"finite floats {list(want)}",
                found=f"{t.dtype} {list(t.shape)}",
                fix=RECAPTURE,
            )


def _identity(meta: dict[str, str], path: Path) -> TargetIdentity:
    want = {f.name for f in fields(TargetIdentity)}
    try:
        data = json.loads(meta["target"])
    except (KeyError, json.JSONDecodeError, RecursionError) as err:
        raise EaglewireError(
            f"{path} does not say which target it is a dump of",
            expected=f"metadata 'target': a JSON object with {sorted(want)}",
            found=f"{type(err).__name__}: {err}",
            fix=RECAPTURE,
        ) from None
    if not isinstance(data, dict) or set(data) != want:
        raise EaglewireError(
            f"{path}: the target identity in its metadata is incomplete",
            expected=str(sorted(want)),
            found=str(sorted(data) if isinstance(data, dict) else data),
            fix=RECAPTURE,
        )
    check_dataclass_fields(data, TargetIdentity, where=f"{path}: metadata 'target'")
    return TargetIdentity(**data)


def _validate(b: Boundaries, ident: TargetIdentity, where: str) -> None:
    """Shapes agree, L+1 boundaries of the target's width, ids in its vocab, something to score."""

    def bad(what: str, expected: str, found: str) -> EaglewireError:
        return EaglewireError(f"{where}: {what}", expected=expected, found=found, fix=RECAPTURE)

    for name, want in TENSORS.items():
        t = getattr(b, name)
        if (str(t.dtype) != want) if name != "states" else not t.is_floating_point():
            raise bad(f"{name} has the wrong dtype", want, str(t.dtype))
    L, H = ident.num_layers, ident.hidden_size
    if b.states.dim() != 4 or b.states.shape[0] != L + 1 or b.states.shape[3] != H:
        raise bad(
            "states are not every boundary of the target",
            f"[L+1, B, T, H] = [{L + 1}, B, T, {H}] (boundaries 0..{L} of {ident.name})",
            f"shape {list(b.states.shape)}",
        )
    for name in ("input_ids", "labels", "scored"):
        if tuple(getattr(b, name).shape) != tuple(b.states.shape[1:3]):
            raise bad(
                f"{name} does not match the states",
                f"[B, T] = {list(b.states.shape[1:3])}",
                f"{list(getattr(b, name).shape)}",
            )
    for name in ("input_ids", "labels"):
        t = getattr(b, name)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= ident.vocab_size):
            raise bad(
                f"{name} holds ids outside the target's vocabulary",
                f"0..{ident.vocab_size - 1}",
                f"{int(t.min())}..{int(t.max())}",
            )
    if not bool(b.scored.any()):
        raise bad("no position is scored", "some True in scored", "all False")
    if not bool(torch.isfinite(b.states).all()):
        raise bad("states hold NaN/Inf", "finite states", f"{int((~torch.isfinite(b.states)).sum())} non-finite")


class DumpTarget:
    """The target as far as a dump knows it: identity, sizes, contracts, and the embedding rows of the
    dump's own tokens (boundary 0). Not a Target: the checks that read a target's weights or config
    (`loaded`) skip it."""

    def __init__(
        self,
        bounds: Boundaries,
        identity: TargetIdentity,
        chat_template_sha256: str | None,
        source: str,
        vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.bounds, self.identity, self.chat_template_sha256 = bounds, identity, chat_template_sha256
        self.vocab = vocab  # (embedding, head) [V, H] each, where the dump holds them
        self.name = f"{identity.name} (boundaries dump {source})"
        H = identity.hidden_size
        flat_ids, flat = bounds.input_ids.reshape(-1), bounds.states[0].reshape(-1, H)  # [N], [N, H]
        self._ids, inverse = torch.unique(flat_ids, return_inverse=True)  # [U] sorted token ids
        first = torch.full((len(self._ids),), len(flat_ids), dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(len(flat_ids)), "amin"
        )  # [U] first occurrence of each token
        self._rows = flat[first].float()  # [U, H]
        # An embedding lookup gives every occurrence of a token the same row; anything added before layer 0
        # (absolute positions, a per-sequence term) breaks that, and boundary 0 is then no embedding.
        if not torch.equal(self._rows[inverse], flat.float()):
            raise EaglewireError(
                f"{source}: boundary 0 differs between occurrences of the same token",
                expected="boundary 0 = the embedding lookup of each token",
                found="this target adds something before decoder layer 0 (positions?)",
                fix="measure where the target loads: eaglewire doctor check DIR --target T",
            )
        self._embedding: torch.Tensor | None = None

    @classmethod
    def from_file(cls, path: Path) -> "DumpTarget":
        bounds, identity, template = load_dump(path)
        return cls(bounds, identity, template, Path(path).name, load_vocab(path))

    @property
    def num_layers(self) -> int:
        return self.identity.num_layers

    @property
    def hidden_size(self) -> int:
        return self.identity.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.identity.vocab_size

    @property
    def tokens(self) -> torch.Tensor:
        """[U] the token ids whose embedding rows the dump holds."""
        return self._ids

    def contract(
        self, taps: tuple[int, ...], *, norm: NormFlags | None = None, vocab_map: Any | None = None
    ) -> WiringContract:
        """The contract Target.contract gives for the dumped target (the same identity and template hash)."""
        return WiringContract.for_target(
            self.identity, taps, norm=norm, vocab_map=vocab_map, chat_template_sha256=self.chat_template_sha256
        )

    def embedding(self) -> torch.Tensor:
        """[V, H] fp32: the dump's tokens' rows, NaN for every other token (a read of one cannot pass).
        As large as the target's embedding, which a draft needs beside it anyway."""
        if self._embedding is None and self.vocab is not None:
            self._embedding = self.vocab[0].float()
        if self._embedding is None:
            emb = torch.full((self.vocab_size, self.hidden_size), float("nan"))
            emb[self._ids] = self._rows
            self._embedding = emb
        return self._embedding

    def head_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """[len(ids), H] fp32 rows of the target's output head (all V when None), where the dump holds it."""
        if self.vocab is None:
            raise EaglewireError(
                f"{self.name} holds no output head",
                expected="a dump written with the target's "
                "embedding and head (a block drafter predicts through the target's head)",
                found="states only",
                fix="re-capture it where the target runs: eaglewire doctor sample --target T --vocab --out FILE",
            )
        head = self.vocab[1].float()
        return head if ids is None else head[ids]


def loaded(target: TargetInfo | None) -> TypeGuard[RunnableTarget]:
    """A loaded target, not a dump's stand-in, which knows the target's identity and sizes only: the doctor's
    checks that read a target's weights or config skip the stand-in (checks.dump_scope says which)."""
    return target is not None and not isinstance(target, DumpTarget)


def require_finite_rows(embedding: torch.Tensor, ids: torch.Tensor, where: str) -> None:
    """Every embedding row the draft reads for `ids` is finite (a dump stand-in's missing rows are NaN)."""
    used = torch.unique(ids)
    bad = used[~torch.isfinite(embedding[used]).all(-1)]
    if len(bad):
        raise EaglewireError(
            f"{where}: the draft would read {len(bad)} embedding row(s) that are not finite",
            expected="finite rows for every token scored (a boundaries dump holds the rows of its own tokens only)",
            found=f"token ids {bad[:8].tolist()}",
            fix="measure on the Boundaries of the same dump (eaglewire doctor check DIR "
            "--boundaries FILE), or with the target",
        )


def capture_dump(
    target: RunnableTarget, path: Path, dtype: torch.dtype = torch.float32, *, vocab: bool = False
) -> Boundaries:
    """sample_target(target) written to `path` (with the target's embedding and head where `vocab`), after checking that boundary 0 is the target's embedding
    (what the draft reads beside the taps; a target that scales it before layer 0, as Gemma does, is refused)."""
    bounds = sample_target(target)
    emb = target.embedding().detach()[bounds.input_ids.to(target.embedding().device)].float().cpu()
    if not torch.equal(bounds.states[0].cpu(), emb):
        diff = float((bounds.states[0].cpu() - emb).abs().max())
        raise EaglewireError(
            f"{target.name}: the input to decoder layer 0 is not its embedding lookup",
            expected="boundary 0 = embed_tokens(ids), which a dump stands in for the embedding with",
            found=f"max |boundary 0 - embedding| = {diff:.3g} (e.g. Gemma scales the embedding by sqrt(hidden_size))",
            fix="measure where the target loads: eaglewire doctor check DIR --target T",
        )
    bounds = replace(bounds, states=bounds.states.to(dtype))
    save_boundaries(
        bounds,
        path,
        target.identity,
        chat_template_sha256=sha256_text(target.chat_template),
        vocab=(target.embedding().cpu(), target.head_rows().cpu()) if vocab else None,
    )
    return bounds
