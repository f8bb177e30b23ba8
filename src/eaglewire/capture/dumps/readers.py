"""Streaming readers for hidden-state dumps written by other tools (and our own feature directories).

Each reader lists its samples without reading any hidden state (`ids()`), then reads one sample at a time
(`read(id)`), so a dump of any size is visited with one sample's tensors in memory. Every sample comes out
as a `DumpSample`: the stored tap states [T, k, H] in stored order and the tool's last-layer state [T, H]
with what the tool says it is (after or before the target's final norm). What a reader cannot prove
(a file that needs arbitrary unpickling, lengths that disagree, a missing key) is refused naming the file.

The tools' readers are their own modules, each citing the files of that tool its layout was verified in:
specforge.py (one torch.save dict per sample, post-norm last state) and speculators.py (an Arrow dataset plus
one safetensors file per row, pre-norm last state). FeatureDirDump here reads our own feature directories.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.capture.dumps.sample import POST_NORM, Dump, DumpSample
from eaglewire.capture.dumps.specforge import CKPT, SpecForgeDump
from eaglewire.capture.dumps.speculators import SpeculatorsDump
from eaglewire.capture.feature_dir import read_manifest
from eaglewire.data.samples import Sample
from eaglewire.errors import EaglewireError

FORMATS = ("specforge", "speculators", "eaglewire")
CONVENTION = {"specforge": "specforge", "speculators": "speculators", "eaglewire": "boundary"}  # contract.py


class FeatureDirDump:
    """Our own feature directory, read through `OfflineFeatures`, the reader `train` uses: inspect passes
    exactly what training would accept (every shard checked against the manifest) and refuses the rest."""

    format, last_kind, missing_rows = "eaglewire", POST_NORM, 0

    def __init__(self, root: Path) -> None:
        from eaglewire.capture.features import OfflineFeatures
        from eaglewire.contract import WiringContract

        self.root = Path(root)
        self.manifest = read_manifest(self.root)  # every field and its type checked
        contract = WiringContract.from_dict(self.manifest["contract"])
        self.declared_taps = contract.taps
        self._features = OfflineFeatures(self.root, contract, pad_id=0, max_cached_shards=1)

    def ids(self) -> list[str]:
        return self._features.sample_ids()

    def layout(self) -> str:
        return "eaglewire feature shards (taps [N, n*H], final_hidden [N, H] post-norm)"

    def read(self, sid: str) -> DumpSample:
        k, _j = self._features.index[sid]
        row = self._features.rows([Sample(sid, torch.empty(0), torch.empty(0))])[0]
        T, H = row["final_hidden"].shape
        return DumpSample(
            sid,
            self.root / self.manifest["shards"][k]["file"],
            row["input_ids"],
            row["loss_mask"],
            row["taps"].reshape(T, -1, H),
            row["final_hidden"],
            POST_NORM,
        )


def detect_format(src: Path) -> str:
    src = Path(src)
    if (src / "manifest.json").is_file():
        return "eaglewire"
    if (src / "state.json").is_file():
        return "speculators"
    if src.is_dir() and any(CKPT.search(p.name) for p in src.rglob("*")):
        return "specforge"
    raise EaglewireError(
        f"{src}: not a dump this version can read",
        expected=", ".join(FORMATS),
        found="no manifest.json, state.json or *.ckpt(.gz) files",
        fix="pass the dump's top directory (SpecForge --output-path, speculators --output)",
    )


def open_dump(src: Path, fmt: str = "auto", states_dir: Path | None = None) -> Dump:
    """states_dir: where speculators wrote hs_*.safetensors when not under the dataset (its --output)."""
    fmt = detect_format(src) if fmt == "auto" else fmt
    readers = {"specforge": SpecForgeDump, "speculators": SpeculatorsDump, "eaglewire": FeatureDirDump}
    if fmt not in readers:
        raise EaglewireError(f"unknown dump format {fmt!r}", expected=", ".join(FORMATS) + " or auto", found=fmt)
    if states_dir is not None:
        if fmt != "speculators":
            raise EaglewireError(
                f"a separate hidden-state directory is a speculators layout, not {fmt}",
                expected="--states-dir only with speculators dumps",
                found=str(states_dir),
            )
        return SpeculatorsDump(Path(src), states_dir)
    return readers[fmt](Path(src))
