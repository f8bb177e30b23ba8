"""The target without its weights in memory, for training from captured features.

Offline training needs of the target only its config (the draft's shape, the contract's identity), its
tokenizer (chat template, padding id) and a few tensors: the input embedding [V, H], the head rows of the
draft vocab (all V rows only for shards without a stored target top-1), the final norm's scale and, for
`init_layers_from_target`, the top decoder layers. `TargetWeights` reads just those, by name, from the
target's safetensors files; the model itself is a skeleton on the meta device (module structure and
config, no storage), so the names and the identity come from the same code as a loaded `Target`'s and
the features' contract check stays exactly as strict. SpecForge's offline trainer does not load the
target either. Peak memory of `eaglewire train --features` before and after: README, "Train a draft".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglewire.errors import TargetError
from eaglewire.safeio import open_safetensors
from eaglewire.target.loader import Target, load_tokenizer, read_target_config, resolve_target, wrap_model

_HEAD_CHUNK_ROWS = 8192  # head rows read at once when gathering a few: bounds the transient to chunk x H


@dataclass
class TargetWeights(Target):
    """A `Target` whose model is a meta-device skeleton: identity, contracts, config and tokenizer as a
    loaded target's; the draft's tensors (`embedding`, `head_rows`, ...) read from the weight files.
    Anything that would run the model (capture, online features, decoding) fails on meta tensors."""

    dtype: torch.dtype = torch.float32  # what tensors are cast to once read (load_target's default)
    files: dict[str, Path] = field(default_factory=dict)  # tensor name in the checkpoint -> its safetensors file
    _embedding: torch.Tensor | None = field(default=None, repr=False)

    def _name_of(self, tensor: torch.Tensor) -> str:
        """The checkpoint name of one of the skeleton's parameters (the model's own parameter name)."""
        for name, p in self.model.named_parameters():
            if p is tensor:
                return name
        raise TargetError(
            "a target tensor has no parameter name",
            expected="a parameter of the model",
            found=f"a tensor of shape {tuple(tensor.shape)}",
        )

    def _read(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise TargetError(
                f"target {self.path} has no tensor {name!r} in its safetensors files",
                expected=f"{name} (the name transformers gives this parameter)",
                found=f"{len(self.files)} tensors, e.g. {sorted(self.files)[:3]}",
                fix="train with the target loaded (online, --data), or re-save the target with save_pretrained",
            )
        with open_safetensors(self.files[name], what="target weights", error=TargetError) as f:
            return f.get_tensor(name).to(self.dtype)

    def embedding(self) -> torch.Tensor:
        """[V, H] read once and kept (the draft holds it for its whole life anyway)."""
        if self._embedding is None:
            self._embedding = self._read(self._name_of(self.embed_tokens.weight))
        return self._embedding

    def head_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """[len(ids), H]: a tied head is the embedding; an untied one is read in row chunks, so gathering
        V_d rows never holds the whole [V, H] head."""
        head = self.model.get_output_embeddings().weight
        if head is self.embed_tokens.weight:
            return self.embedding() if ids is None else self.embedding()[ids]
        name = self._name_of(head)
        if ids is None:
            return self._read(name)
        if name not in self.files:
            return self._read(name)  # raises, naming the missing tensor
        ids = ids.long()
        out = torch.empty(len(ids), head.shape[1], dtype=self.dtype)  # [len(ids), H]
        with open_safetensors(self.files[name], what="target weights", error=TargetError) as f:
            rows = f.get_slice(name)
            for a in range(0, head.shape[0], _HEAD_CHUNK_ROWS):
                sel = (ids >= a) & (ids < a + _HEAD_CHUNK_ROWS)
                if sel.any():
                    out[sel] = rows[a : a + _HEAD_CHUNK_ROWS][ids[sel] - a].to(self.dtype)
        return out

    def final_norm_weight(self) -> torch.Tensor | None:
        w = getattr(self.final_norm, "weight", None)
        return None if w is None else self._read(self._name_of(w))

    def layer_parameters(self, index: int) -> dict[str, torch.Tensor]:
        prefix = f"{self.layers_path}.{index}."
        return {n: self._read(prefix + n) for n, _ in self.layers[index].named_parameters()}


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> file, over every *.safetensors file of `path` (headers only: nothing is read)."""
    files: dict[str, Path] = {}
    for file in sorted(path.glob("*.safetensors")):
        with open_safetensors(file, what="target weights", error=TargetError) as f:
            files.update(dict.fromkeys(f.keys(), file))
    return files


def load_target_weights(
    spec: str | None = None, *, dtype: torch.dtype = torch.float32, with_tokenizer: bool = True
) -> TargetWeights:
    """The target `spec` (as `load_target` resolves it) without loading its weights: config, tokenizer,
    a meta skeleton and an index of its safetensors files. Refused where it has no safetensors files
    (a .bin checkpoint would have to be unpickled whole)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name, path = resolve_target(spec)
    files = _tensor_files(path)
    if not files:
        raise TargetError(
            f"target {str(path)!r} has no safetensors weights to read tensors from",
            expected="*.safetensors files",
            found=str(sorted(p.name for p in path.iterdir())[:8]),
            fix="re-save the target with save_pretrained (safetensors), or train online (--data)",
        )
    read_target_config(path)  # sizes and physics checked before transformers reads the config
    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):  # structure only: no storage is allocated, no weight is read
            skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # untyped upstream
    except Exception as err:  # any failure of transformers on an untrusted config is this error
        raise TargetError(
            f"transformers cannot build target {str(path)!r} as a causal LM",
            expected="a config AutoModelForCausalLM knows",
            found=f"model_type={getattr(config, 'model_type', '?')!r}: {err}",
        ) from None
    # Checkpoints whose names transformers maps on load (older or foreign layouts) cannot be read by
    # parameter name: refused here, before training starts, rather than at the first missing tensor.
    missing = [n for n, _ in skeleton.named_parameters() if n not in files]
    if missing:
        raise TargetError(
            f"target {str(path)!r} names its tensors otherwise than {type(skeleton).__name__} does",
            expected=f"every parameter by name, e.g. {missing[0]!r}",
            found=f"{len(missing)} of them absent; the files hold e.g. {sorted(files)[:3]}",
            fix="re-save the target with save_pretrained, or let `train` load it whole",
        )
    t = wrap_model(skeleton, name, load_tokenizer(path) if with_tokenizer else None, path)
    return TargetWeights(
        name=t.name,
        model=t.model,
        tokenizer=t.tokenizer,
        layers_path=t.layers_path,
        layers=t.layers,
        final_norm=t.final_norm,
        embed_tokens=t.embed_tokens,
        path=path,
        dtype=dtype,
        files=files,
    )
