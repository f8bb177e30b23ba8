"""`eaglewire import --format llamacpp`: a GGUF draft (EAGLE-3 or DFlash, export/llamacpp_layout.py) into the native
model, strictly: a known arch, every tensor a weight the family defines and none missing (the strict loaders
check names, shapes, one float dtype, finite values), the target_layers against the contract side file.
f32 / f16 / bf16 files come back bit for bit (norms, stored f32 by llama.cpp's rule, are cast back to the
weights' dtype, exact for a draft of that dtype); a Q8_0 file is dequantized to f32.

t2d is not stored (llama.cpp drops it): it is rebuilt from d2t, which the GGUF holds as absolute target ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from eaglewire.contract import WiringContract, from_engine
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.base import read_contract
from eaglewire.export.gguf_draft import unpermute_qk
from eaglewire.families import BlockWiring
from eaglewire.norms import NormFlags
from eaglewire.target.protocol import TargetInfo


def gguf_path(path: Path) -> Path:
    """The GGUF file of an export directory (DIR/draft.gguf), or the file itself."""
    path = Path(path)
    file = path / lay.GGUF_FILE if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(
            f"no GGUF draft at {path}",
            expected=f"a .gguf file or a folder holding {lay.GGUF_FILE}",
            found="missing",
            fix="point at the directory `eaglewire export --format llamacpp` wrote",
        )
    return file


class GGUFDraft:
    """A GGUF draft's metadata and tensors, read once (gguf.GGUFReader), with the family record."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = gguf_path(path)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except (ValueError, OSError, IndexError, KeyError) as err:  # gguf's own checks of the header and offsets
            raise CheckpointError(
                f"{self.path} is not a readable GGUF file",
                expected="GGUF v2/v3",
                found=f"{type(err).__name__}: {err}"[:200],
                fix="re-export the draft",
            ) from None
        arch = self.value(lay.ARCH_KEY)
        if arch not in lay.BY_ARCH:
            raise CheckpointError(
                f"{self.path} is not a GGUF draft eaglewire reads",
                expected=" or ".join(lay.BY_ARCH),
                found=f"general.architecture={arch!r}",
                fix="import the draft llama.cpp serves with --spec-type draft-eagle3 or draft-dflash",
            )
        self.family = lay.BY_ARCH[arch]

    def value(self, key: str, default: Any = KeyError) -> Any:
        field = self.reader.fields.get(key.format(arch=getattr(self, "family", lay.EAGLE3).arch))
        if field is None:
            if default is KeyError:
                raise CheckpointError(
                    f"{self.path} lacks {key.format(arch=self.family.arch)}",
                    expected="the key llama.cpp's converter writes",
                    found="missing",
                    fix="re-export the draft",
                )
            return default
        return field.contents()

    @property
    def ids(self) -> list[int]:
        ids = self.value(lay.TARGET_LAYERS)
        if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
            raise CheckpointError(
                f"{self.path}: target_layers is not a list of layer ids",
                expected="ints",
                found=repr(ids)[:80],
                fix="re-export the draft",
            )
        return ids

    def tensors(self) -> dict[str, torch.Tensor]:
        """Native names -> tensors as stored (GGUF's reversed ne undone), Q8_0 dequantized, q/k un-permuted."""
        import gguf

        q, fam, out = gguf.GGMLQuantizationType, self.family, {}
        for t in self.reader.tensors:
            native = fam.native_name(t.name)
            if native is None:
                raise CheckpointError(
                    f"{self.path}: unexpected tensor {t.name!r}",
                    expected=f"the {fam.arch} tensors eaglewire writes",
                    found=t.name,
                    fix="the file is not an eaglewire "
                    "draft of this family, or it holds weights eaglewire's drafts do not have",
                )
            shape = [int(n) for n in reversed(t.shape)]
            if t.tensor_type in (q.F32, q.F16, q.I64):
                data = np.array(t.data).reshape(shape)
            elif t.tensor_type in (q.BF16, q.Q8_0, q.Q4_0):
                data = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(shape)
            else:
                raise CheckpointError(
                    f"{self.path}: {t.name} is {t.tensor_type.name}",
                    expected="F32, F16, BF16, Q8_0 (I64 for d2t)",
                    found=t.tensor_type.name,
                    fix="re-export the draft",
                )
            tensor = torch.from_numpy(np.ascontiguousarray(data))
            if t.tensor_type == q.BF16:
                tensor = tensor.to(torch.bfloat16)
            out[native] = tensor
        return out


def _draft_config(g: GGUFDraft, num_taps: int, vocab_size: int, draft_vocab: int) -> DraftConfig:
    """DraftConfig from the GGUF's hyperparameters (the inverse of gguf_draft._hparams)."""
    h = {k: g.value(v) for k, v in lay.HPARAMS.items() if k not in ("vocab_size", "rope_dimension_count")}
    norm = NormFlags(
        norm_before_fc=bool(g.value(lay.NORM_BEFORE_FC, False)),
        norm_before_residual=bool(g.value(lay.NORM_BEFORE_RESIDUAL, False)),
    )
    return DraftConfig(
        hidden_size=h["embedding_length"],
        intermediate_size=h["feed_forward_length"],
        num_attention_heads=h["head_count"],
        num_key_value_heads=h["head_count_kv"],
        head_dim=h["key_length"],
        target_hidden_size=g.value(lay.TARGET_HIDDEN_SIZE, h["embedding_length"]),
        num_taps=num_taps,
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab,
        num_layers=h["block_count"],
        rms_norm_eps=float(h["rms_eps"]),
        rope_theta=float(h["rope_freq_base"]),
        max_position_embeddings=h["context_length"],
        norm=norm,
    )


def _vocab(native: dict[str, torch.Tensor], vocab_size: int, where: Path) -> VocabMap | None:
    """d2t's absolute ids -> the native relative d2t and its t2d (None: the full vocabulary)."""
    if lay.D2T not in native:
        return None
    absolute = native.pop(lay.D2T).to(torch.int64)  # [draft_vocab]
    if absolute.numel() and (absolute.min() < 0 or absolute.max() >= vocab_size):
        raise CheckpointError(
            f"{where}: d2t names tokens outside the target's vocabulary",
            expected=f"absolute ids in [0, {vocab_size})",
            found=f"[{int(absolute.min())}, {int(absolute.max())}]",
            fix="a d2t written relative (as HF checkpoints hold it) is not llama.cpp's; convert the draft again",
        )
    vmap = VocabMap.from_target_ids(absolute, vocab_size)
    native[lay.D2T], native["t2d"] = vmap.d2t, vmap.t2d
    return vmap


def _block(g: GGUFDraft) -> BlockWiring:
    if g.value(lay.SLIDING_WINDOW, None) is not None:
        raise CheckpointError(
            f"{g.path}: a DFlash draft with sliding-window layers",
            expected="full attention in every layer (what eaglewire's DFlash computes)",
            found=f"{lay.SLIDING_WINDOW} set",
            fix="eaglewire does not compute this DFlash variant; check it with the doctor",
        )
    mask = g.value(lay.MASK_TOKEN_KEY)
    return BlockWiring(
        block_size=int(g.value(lay.BLOCK_SIZE)),
        mask_token_id=int(mask),
        causal=True if g.value(lay.CAUSAL, False) else None,
    )


def _contract(
    g: GGUFDraft, target: TargetInfo | None, taps: tuple[int, ...] | None, vmap: VocabMap | None, norm: NormFlags
) -> WiringContract:
    from eaglewire.draft.dflash_contract import dflash_contract

    side = read_contract(g.path.parent)
    if taps is None and side is not None:
        if list(side.engine_ids("llamacpp")) != g.ids:
            raise ContractMismatch(
                f"{g.path}: target_layers disagree with the wiring contract",
                expected=f"llamacpp ids {list(side.engine_ids('llamacpp'))} (taps {list(side.taps)})",
                found=f"target_layers {g.ids}",
                fix="the GGUF was edited or replaced after export; re-export from the native draft",
            )
        return side
    if target is None:
        raise CheckpointError(
            f"{g.path.parent} has no eaglewire_contract.json",
            expected="the contract side file, or --target to rebuild the contract",
            found="neither",
            fix="pass --target",
        )
    taps = taps if taps is not None else from_engine(g.ids, "llamacpp", target.num_layers)
    if g.family.block:
        return dflash_contract(target, tuple(taps), _block(g), vmap)
    if vmap is None:
        raise CheckpointError(
            f"{g.path}: an EAGLE-3 GGUF without d2t",
            expected="d2t",
            found="absent",
            fix="eaglewire's EAGLE-3 drafts carry their vocabulary map; re-export the draft",
        )
    contract: WiringContract = target.contract(tuple(taps), norm=norm, vocab_map=vmap)
    return contract


def import_gguf(
    path: Path, *, target: TargetInfo | None = None, taps: tuple[int, ...] | None = None
) -> tuple[Any, WiringContract]:
    """The native draft and its contract (side file, or rebuilt on `target` from target_layers or `taps`)."""
    from eaglewire.draft.load import loader_for

    g = GGUFDraft(path)
    native = g.tensors()
    vocab_size = int(g.value(lay.HPARAMS["vocab_size"], 0)) or (
        target.vocab_size if target is not None else len(g.value("tokenizer.ggml.tokens", []))
    )
    side = read_contract(g.path.parent)
    vocab_size = side.target.vocab_size if side is not None else vocab_size
    vmap = _vocab(native, vocab_size, g.path)
    norm = NormFlags(
        norm_before_fc=bool(g.value(lay.NORM_BEFORE_FC, False)),
        norm_before_residual=bool(g.value(lay.NORM_BEFORE_RESIDUAL, False)),
    )
    contract = _contract(g, target, taps, vmap, norm)
    block, here = contract.block, _block(g) if g.family.block else None
    if (
        block is not None
        and here is not None
        and (block.block_size, block.mask_token_id, bool(block.causal))
        != (here.block_size, here.mask_token_id, bool(here.causal))
    ):
        raise ContractMismatch(
            f"{g.path}: block size / mask token / causal flag disagree with the contract",
            expected=str(block),
            found=str(here),
            fix="re-export the draft",
        )
    cfg = _draft_config(g, contract.num_taps, vocab_size, vmap.draft_vocab_size if vmap else vocab_size)
    if g.family.permute_qk:
        for name in [n for n in native if n.endswith(("q_proj.weight", "k_proj.weight"))]:
            native[name] = unpermute_qk(
                native[name], cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            )
    floats = {t.dtype for t in native.values() if t.is_floating_point() and t.dim() >= 2}
    if len(floats) == 1:  # norms are f32 whatever the file type: back to the weights' dtype
        dtype = floats.pop()
        native = {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in native.items()}
    embedding = "embed_tokens.weight" in native
    return loader_for(contract)(
        cfg, contract, native, str(g.path), embedding=embedding or None, target=target
    ), contract
