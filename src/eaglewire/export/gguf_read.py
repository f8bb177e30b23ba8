"""Reading a GGUF draft (or the target GGUF it will be served with) for the doctor, every knob as stored.

The file is parsed by the PyPI `gguf` package's GGUFReader (a memory map of typed fields and tensors:
nothing is unpickled or executed). Which keys and tensors a draft has is llama.cpp's layout record
(export/llamacpp_layout.py); this module reads each knob back (None where absent), any GGUF's sizes and
vocabulary (a target GGUF's too); the weights go into the native model through `eaglewire import --format
llamacpp`'s loader (export/gguf_import.py). A GGUF whose general.architecture is not a draft family
llama.cpp serves (a target model, say) is refused naming what it is, never read as a draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eaglewire.errors import CheckpointError
from eaglewire.export.llamacpp_layout import (
    ARCH_KEY,
    BLOCK_SIZE,
    BY_ARCH,
    CAUSAL,
    D2T,
    GGUF_FILE,
    HPARAMS,
    MASK_TOKEN_KEY,
    NORM_BEFORE_FC,
    NORM_BEFORE_RESIDUAL,
    SLIDING_WINDOW,
    TARGET_HIDDEN_SIZE,
    TARGET_LAYERS,
    GGUFFamily,
)

TOKENS_KEY = "tokenizer.ggml.tokens"  # the vocabulary's token texts (llama-server compares draft and target)
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


@dataclass
class GGUFModel:
    """Any GGUF's metadata (tokenizer texts aside) and its architecture's sizes: what a target GGUF is
    compared by."""

    path: Path
    arch: str
    metadata: dict[str, Any]  # every key but the token lists, decoded to Python values
    tokens: list[str] | None  # tokenizer.ggml.tokens
    tensor_shapes: dict[str, tuple[int, ...]]  # in torch's order ([out, in] for a weight)

    def number(self, key: str) -> int | None:
        """An integer key's value (None: absent); a value of another type is refused naming the key."""
        v = self.metadata.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise CheckpointError(
                f"{self.path}: {key} is not an integer",
                expected=f"{key}: an integer",
                found=repr(v)[:80],
                fix="re-convert the GGUF; it is damaged or hand-edited",
            )
        return v

    def flag(self, key: str) -> bool | None:
        v = self.metadata.get(key)
        if v is not None and not isinstance(v, bool):
            raise CheckpointError(
                f"{self.path}: {key} is not a boolean",
                expected=f"{key}: true or false",
                found=repr(v)[:80],
                fix="re-convert the GGUF; it is damaged or hand-edited",
            )
        return v

    @property
    def hidden_size(self) -> int | None:
        return self.number(HPARAMS["embedding_length"].format(arch=self.arch))

    @property
    def num_layers(self) -> int | None:
        return self.number(HPARAMS["block_count"].format(arch=self.arch))

    @property
    def vocab_size(self) -> int | None:
        """{arch}.vocab_size, else the token list's length (what llama.cpp itself falls back to)."""
        v = self.number(HPARAMS["vocab_size"].format(arch=self.arch))
        return v if v is not None else (len(self.tokens) if self.tokens is not None else None)


@dataclass
class GGUFDraft(GGUFModel):
    """A GGUF draft as llama.cpp reads it: its family's record and the values of each knob (None = absent)."""

    family: GGUFFamily = field(default=None)  # type: ignore[assignment]  # always set by read_gguf_draft
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # GGUF names, float32 (d2t int64)

    @property
    def target_layers(self) -> list[int] | None:
        key = self.family.key(TARGET_LAYERS)
        v = self.metadata.get(key)
        if v is not None and not (
            isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        ):
            raise CheckpointError(
                f"{self.path}: {key} is not a list of layer ids",
                expected=f"{key}: integers",
                found=repr(v)[:80],
                fix="re-convert the GGUF; it is damaged or hand-edited",
            )
        return v

    @property
    def target_hidden_size(self) -> int | None:
        return self.number(self.family.key(TARGET_HIDDEN_SIZE))

    @property
    def norms(self) -> dict[str, bool | None]:
        """The norm flags llama.cpp reads for this family, as stored (None: the key is absent)."""
        keys = {"norm_before_residual": NORM_BEFORE_RESIDUAL, "norm_before_fc": NORM_BEFORE_FC}
        return {flag: self.flag(self.family.key(keys[flag])) for flag in sorted(self.family.norms)}

    @property
    def block_size(self) -> int | None:
        return self.number(self.family.key(BLOCK_SIZE))

    @property
    def causal(self) -> bool | None:
        return self.flag(self.family.key(CAUSAL))

    @property
    def sliding_window(self) -> int | None:
        return self.number(self.family.key(SLIDING_WINDOW))

    @property
    def mask_token_id(self) -> int | None:
        return self.number(MASK_TOKEN_KEY)

    @property
    def draft_vocab_size(self) -> int | None:
        """The draft's own vocabulary as llama.cpp sizes it: d2t's length, else the head's rows."""
        if D2T in self.tensor_shapes:
            return self.tensor_shapes[D2T][0]
        head = self.tensor_shapes.get(self.family.gguf_name("lm_head.weight") or "")
        return head[0] if head else None

    @property
    def d2t_absolute(self) -> torch.Tensor | None:
        """d2t as stored: llama.cpp reads it as the ABSOLUTE target id of each draft row. int64 [V_d]"""
        return self.tensors.get(D2T)


def find_gguf(path: Path) -> Path:
    """The GGUF file itself, or the one GGUF in a directory (export --format llamacpp's draft.gguf first)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / GGUF_FILE).is_file():
            return path / GGUF_FILE
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        raise CheckpointError(
            f"{path} holds {len(found)} GGUF files",
            expected="one GGUF draft file",
            found=", ".join(p.name for p in found) or "none",
            fix="point at the draft's .gguf file itself",
        )
    raise CheckpointError(
        f"{path} does not exist",
        expected="a GGUF file or a directory holding one",
        found="nothing",
        fix="check the path",
    )


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, OSError, KeyError, IndexError) as err:  # bad magic, truncated, unknown types
        raise CheckpointError(
            f"{path} is not a readable GGUF file ({err})",
            expected="a GGUF file (llama.cpp's format: the magic bytes GGUF)",
            found=path.name,
            fix="re-convert the draft (eaglewire export --format llamacpp)",
        ) from err


def _value(fld: Any) -> Any:
    v = fld.contents()
    return (
        [x.item() if isinstance(x, np.generic) else x for x in v]
        if isinstance(v, list)
        else (v.item() if isinstance(v, np.generic) else v)
    )


def read_gguf(path: Path) -> tuple[GGUFModel, Any]:
    """Any GGUF's metadata and tensor shapes (tensors are not read), and the reader for the tensors."""
    path = find_gguf(path)
    reader = _open(path)
    meta = {
        k: _value(f)
        for k, f in reader.fields.items()
        if not k.startswith("GGUF.")
        and k not in (TOKENS_KEY, "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    }
    tokens = reader.fields[TOKENS_KEY].contents() if TOKENS_KEY in reader.fields else None
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    arch = meta.get(ARCH_KEY)
    if not isinstance(arch, str):
        raise CheckpointError(
            f"{path} has no {ARCH_KEY}",
            expected="a GGUF model file",
            found="no architecture",
            fix="re-convert it with llama.cpp's convert_hf_to_gguf.py",
        )
    return GGUFModel(path, arch, meta, tokens, shapes), reader


def _tensor(t: Any) -> torch.Tensor:
    """A GGUF tensor as torch, in torch's dimension order; quantized types are dequantized to float32."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(t.shape))
    if t.tensor_type == GGMLQuantizationType.I64:
        return torch.from_numpy(np.array(t.data, dtype=np.int64)).reshape(shape)
    data = dequantize(np.asarray(t.data), t.tensor_type)
    return torch.from_numpy(np.array(data, dtype=np.float32)).reshape(shape)


def read_gguf_draft(path: Path, *, with_tensors: bool = True) -> GGUFDraft:
    """A GGUF draft of a family llama.cpp serves (layout record BY_ARCH); a GGUF of any other
    architecture (a target, a plain model) is refused naming what it is."""
    model, reader = read_gguf(path)
    family = BY_ARCH.get(model.arch)
    if family is None:
        raise CheckpointError(
            f"{model.path} is a GGUF of architecture {model.arch!r}, not a draft",
            expected="a draft GGUF: general.architecture " + " or ".join(map(repr, BY_ARCH)),
            found=f"general.architecture = {model.arch!r}",
            fix="point the doctor at the draft GGUF (llama-server -md); a target GGUF goes to --target-gguf",
        )
    tensors = {t.name: _tensor(t) for t in reader.tensors} if with_tensors else {}
    return GGUFDraft(model.path, model.arch, model.metadata, model.tokens, model.tensor_shapes, family, tensors)
