"""What the doctor reads of a GGUF draft (`eaglewire doctor DRAFT.gguf --engine llamacpp`): the draft GGUF as
export/gguf_read.py reads it, the training side's truth (the contract side file beside it), the target it will be
served with (a loaded target, or the target GGUF llama-server loads with -m) and the llama.cpp release whose rules
apply. The checks are gguf_checks.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.contract import WiringContract
from eaglewire.doctor.trained_taps import Measurement
from eaglewire.errors import CheckpointError
from eaglewire.export.base import read_contract
from eaglewire.export.gguf_read import GGUFDraft, GGUFModel, read_gguf, read_gguf_draft
from eaglewire.export.llamacpp_layout import BY_ARCH, release
from eaglewire.target.protocol import TargetInfo


@dataclass
class GGUFInspection:
    """A GGUF draft, what is known of its training (contract beside it), and what it will be served with."""

    draft: GGUFDraft
    contract: WiringContract | None
    target_gguf: GGUFModel | None
    target: TargetInfo | None  # a loaded target or a boundaries dump's stand-in (capture.boundary_file.DumpTarget)
    measured: Measurement | None = None  # the empirical check's result, when it ran
    version: str | None = None  # the llama.cpp release (llama-cpp-python version) whose rules apply; None: newest

    @property
    def num_layers(self) -> int | None:
        """The target's depth: the loaded target's, the target GGUF's, else the one the contract names."""
        if self.target is not None:
            return int(self.target.num_layers)
        if self.target_gguf is not None and self.target_gguf.num_layers is not None:
            return int(self.target_gguf.num_layers)
        return self.contract.target.num_layers if self.contract is not None else None

    @property
    def vocab_size(self) -> int | None:
        for source in (self.target, self.target_gguf):
            if source is not None and source.vocab_size is not None:
                return int(source.vocab_size)
        return self.contract.target.vocab_size if self.contract is not None else self.draft.vocab_size

    @property
    def trained(self) -> tuple[int, ...] | None:
        return tuple(self.contract.taps) if self.contract is not None else None


def inspect_gguf(
    path: Path, target: TargetInfo | None = None, target_gguf: Path | None = None, version: str | None = None
) -> GGUFInspection:
    """Read the draft GGUF, the contract side file beside it (if any) and the target GGUF (if given);
    `version`: the llama.cpp release whose rules apply (refused unless read: llamacpp_layout.RELEASES)."""
    release(version)
    draft = read_gguf_draft(path)
    tg = None
    if target_gguf is not None:
        tg = read_gguf(target_gguf)[0]
        if tg.arch in BY_ARCH:
            raise CheckpointError(
                f"--target-gguf {target_gguf} is a {tg.arch} draft, not a target model",
                expected="the target GGUF llama-server loads with -m",
                found=f"arch {tg.arch!r}",
                fix="pass the target model's GGUF to --target-gguf",
            )
    return GGUFInspection(draft, read_contract(draft.path.parent), tg, target, version=version)
