"""What every dump reader returns: one `DumpSample` per sample (tap states [T, k, H] in stored order, the
tool's last-layer state [T, H] and which side of the target's final norm it is), the `Dump` protocol the
readers follow, and the checks they share (a token vector, one length T for every stored tensor), each
refusal naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from eaglewire.errors import EaglewireError

POST_NORM = "post-norm"  # the target's final-norm output (what the LM head reads)
PRE_NORM = "pre-norm"  # the last decoder layer's output before the final norm (boundary L)


@dataclass
class DumpSample:
    id: str
    path: Path  # the file holding this sample's states (named in every error about it)
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] int64, as the tool stored it
    taps: torch.Tensor  # [T, k, H] stored tap states, in stored order
    last: torch.Tensor  # [T, H] the tool's last-layer state
    last_kind: str  # POST_NORM or PRE_NORM: what the tool's layout says `last` is

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "loss_mask": self.loss_mask, "taps": self.taps, "last": self.last}


class Dump(Protocol):
    format: str
    root: Path
    last_kind: str
    declared_taps: tuple[int, ...] | None  # boundaries the dump itself records (our feature dirs only)
    missing_rows: int  # dataset rows without hidden states (speculators' --max-samples); 0 elsewhere

    def ids(self) -> list[str]: ...
    def read(self, sid: str) -> DumpSample: ...
    def layout(self) -> str: ...


def bad(path: Path, what: str, expected: str, found: str, fix: str | None = None) -> EaglewireError:
    """The error for a dump file that is not what its format says: `path: what`, expected, found, fix."""
    return EaglewireError(f"{path}: {what}", expected=expected, found=found, fix=fix)


def token_vector(path: Path, name: str, t: object) -> torch.Tensor:
    """A [T] (or [1, T]) integer tensor as int64 [T]."""
    if (
        not isinstance(t, torch.Tensor)
        or t.is_floating_point()
        or t.dim() not in (1, 2)
        or (t.dim() == 2 and t.shape[0] != 1)
    ):
        found = f"{type(t).__name__} {tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise bad(path, f"{name} is not a token vector", f"{name}: an integer tensor [T]", found)
    return t.reshape(-1).long()


def check_lengths(path: Path, shapes: dict[str, int]) -> None:
    if len(set(shapes.values())) > 1:
        raise bad(
            path,
            "the stored tensors disagree on the number of positions",
            "one length T for input_ids, loss_mask and every state",
            ", ".join(f"{k}: {v}" for k, v in shapes.items()),
            "the dump is damaged or was written padded; re-create this sample",
        )
