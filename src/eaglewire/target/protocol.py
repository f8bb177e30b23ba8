"""What the doctor, the exporters and the trainer read of a target, whichever kind it is.

Three kinds stand for a target: the loaded model (loader.Target), its tensors read by name without the
model (weights.TargetWeights, offline training), and the stand-in built from a boundaries dump where the
target cannot load here (capture.boundary_file.DumpTarget). Code that only needs the target's sizes,
identity and draft-facing tensors takes a `TargetInfo`, so any of the three serves; code that builds or
warm-starts a draft from the target's weights and config takes a `TargetTensors` (a loaded target, or its
weights read by name); code that runs the target (capture, decoding, serving, regenerating) takes a
`RunnableTarget`, which loader.Target is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from eaglewire.contract import TargetIdentity, WiringContract
from eaglewire.norms import NormFlags


@runtime_checkable
class TargetInfo(Protocol):
    """A target's sizes, identity and the tensors a draft is built from."""

    name: str

    @property
    def num_layers(self) -> int: ...  # decoder layers L (boundaries 0..L)

    @property
    def hidden_size(self) -> int: ...  # H

    @property
    def vocab_size(self) -> int: ...  # V

    @property
    def identity(self) -> TargetIdentity: ...

    @property
    def chat_template_sha256(self) -> str | None: ...  # what a draft's contract records of the template

    def embedding(self) -> torch.Tensor: ...  # [V, H] the input embedding (a draft shares it, frozen)

    def contract(
        self, taps: tuple[int, ...], *, norm: NormFlags | None = None, vocab_map: Any | None = None
    ) -> WiringContract: ...  # a wiring contract for this target

    def head_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor: ...  # [len(ids), H] the output head's rows


@runtime_checkable
class TargetTensors(TargetInfo, Protocol):
    """A target whose config and weights can be read: what a draft is built and warm-started from."""

    tokenizer: Any | None  # a transformers tokenizer, None for a target built in-process

    @property
    def text_config(self) -> Any: ...  # the transformers text config (sizes, rope, norms)

    def final_norm_weight(self) -> torch.Tensor | None: ...  # [H]

    def layer_parameters(self, index: int) -> dict[str, torch.Tensor]: ...  # decoder layer `index`'s, by name


@runtime_checkable
class RunnableTarget(TargetTensors, Protocol):
    """A loaded target that runs (loader.Target): its model, the decoder-layer stack capture hooks, and where
    and in what it computes."""

    model: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    embed_tokens: nn.Embedding
    path: Path | None  # the HF directory it was loaded from (None: built in-process)

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def chat_template(self) -> str | None: ...
