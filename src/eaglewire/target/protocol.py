"""What the doctor, the exporters and the trainer read of a target, whichever kind it is.

Three kinds stand for a target: the loaded model (loader.Target), its tensors read by name without the
model (weights.TargetWeights, offline training), and the stand-in built from a boundaries dump where the
target cannot load here (capture.boundary_file.DumpTarget). Code that only needs the target's sizes,
identity and draft-facing tensors takes a `TargetInfo`, so any of the three serves.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

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

    def contract(self, taps: tuple[int, ...], *, norm: NormFlags | None = None,
                 vocab_map: Any | None = None) -> WiringContract: ...  # a wiring contract for this target
