"""Streaming readers for hidden-state dumps written by other tools (and our own feature directories).

Each reader lists its samples without reading any hidden state (`ids()`), then reads one sample at a time
(`read(id)`), so a dump of any size is visited with one sample's tensors in memory. Every sample comes out
as a `DumpSample`: the stored tap states [T, k, H] in stored order and the tool's last-layer state [T, H]
with what the tool says it is (after or before the target's final norm). What a reader cannot prove
(a file that needs arbitrary unpickling, lengths that disagree, a missing key) is refused naming the file.

SpecForge (sgl-project/SpecForge), offline EAGLE-3 data: `DIR/rows_{g}-{g+N}/data_{i}.ckpt` (or
`.ckpt.gz`), one `torch.save` dict per sample, verified in
    scripts/prepare_hidden_states.py (the writer: `DataPoint(input_ids [T], loss_mask [T],
        hidden_state [1, T, H], aux_hidden_state [1, T, 3H])`, its `asdict` saved by torch's serializer, samples
        with NaN skipped, `rows_{g}-{g+file_group_size}` groups, `data_{idx}.ckpt`);
    site-packages/specforge/data/preprocessing.py (`OfflineEagle3Dataset`, `process_offline_eagle3_sample`:
        aux_hidden_state is the draft's input, hidden_state the `target` that only the LM head is applied
        to, loss_mask's last position zeroed at read time; `.ckpt` and `.ckpt.gz` suffixes);
    site-packages/specforge/runtime/data_plane/feature_store.py (`load_feature_file`: `.gz` is gunzipped
        whole, then `torch.load`; SpecForge itself loads with `weights_only=False`, we never do);
    site-packages/specforge/offline_capture/sglang_backend/utils.py (`last_hidden_states` are SGLang's
        pruned post-final-norm states; the pre-norm ones are a separate tensor that is not stored).
speculators (vllm-project/speculators 0.9.0), offline data: `DIR/` an Arrow dataset from `save_to_disk`
(`state.json` lists the `data-*.arrow` files; columns `input_ids`, `loss_mask`, `seq_len`) plus
`DIR/hidden_states/hs_{row}.safetensors`, verified in
    site-packages/speculators/cli/prepare_data.py (`dataset.save_to_disk(output)`) and
        speculators/data_generation/preprocessing.py (`_append_row`: input_ids/loss_mask int64 per row);
    site-packages/speculators/cli/generate_offline_data.py (hs files in `DIR/hidden_states` by default,
        named by the Arrow row index) and speculators/data_generation/offline.py (`check_hidden_states`:
        keys `token_ids`, `hidden_states` with shape[0] == len(token_ids), finite values);
    site-packages/speculators/train/data.py (`ArrowDataset`: hs file index = row index; token_ids must
        equal the row's input_ids; taps = `hidden_states[:, :-1]`, `verifier_last_hidden_states` =
        `hidden_states[:, -1]`) and speculators/models/eagle3/core.py (`verifier_norm` is applied to that
        last state before the head: it is the last layer's output BEFORE the final norm);
    site-packages/hs_connectors/fp8_utils.py (fp8 payloads: `hidden_states` float8 + `hidden_states_scales`
        fp32 [T, 1, 1], dequantized as `hs.to(dtype) * scale`).
"""

from __future__ import annotations

import gzip
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from eaglewire.capture.feature_dir import read_manifest
from eaglewire.data.samples import Sample
from eaglewire.errors import EaglewireError
from eaglewire.safeio import read_json_object, read_safetensors_file

POST_NORM = "post-norm"  # the target's final-norm output (what the LM head reads)
PRE_NORM = "pre-norm"  # the last decoder layer's output before the final norm (boundary L)
FORMATS = ("specforge", "speculators", "eaglewire")
CONVENTION = {"specforge": "specforge", "speculators": "speculators", "eaglewire": "boundary"}  # contract.py
_CKPT = re.compile(r"(\.ckpt|\.ckpt\.gz)$")


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


def _bad(path: Path, what: str, expected: str, found: str, fix: str | None = None) -> EaglewireError:
    return EaglewireError(f"{path}: {what}", expected=expected, found=found, fix=fix)


def _tokens(path: Path, name: str, t: object) -> torch.Tensor:
    """A [T] (or [1, T]) integer tensor as int64 [T]."""
    if (
        not isinstance(t, torch.Tensor)
        or t.is_floating_point()
        or t.dim() not in (1, 2)
        or (t.dim() == 2 and t.shape[0] != 1)
    ):
        found = f"{type(t).__name__} {tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise _bad(path, f"{name} is not a token vector", f"{name}: an integer tensor [T]", found)
    return t.reshape(-1).long()


def _check_lengths(path: Path, shapes: dict[str, int]) -> None:
    if len(set(shapes.values())) > 1:
        raise _bad(
            path,
            "the stored tensors disagree on the number of positions",
            "one length T for input_ids, loss_mask and every state",
            ", ".join(f"{k}: {v}" for k, v in shapes.items()),
            "the dump is damaged or was written padded; re-create this sample",
        )


# --------------------------------------------------------------------------------------------------
# SpecForge
# --------------------------------------------------------------------------------------------------


def load_torch_file(path: Path) -> dict:
    """`torch.load(..., weights_only=True)` only: tensors, dicts, lists and numbers. A .ckpt is a pickle and
    unpickling runs whatever it names, so the globals it would import are listed first (without building
    anything) and a file that names any is refused with them."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:  # torch.load needs the zip's central directory at the end
                src: Path | io.BytesIO = io.BytesIO(f.read())
        else:
            src = path
        unsafe = get_unsafe_globals_in_checkpoint(src)
        if unsafe:
            raise _bad(
                path,
                "refused: the file needs more than weights_only unpickling",
                "a torch.save dict of tensors (weights_only=True loads it)",
                f"pickled objects of {unsafe}",
                "re-create the sample with the tool's writer; eaglewire never unpickles arbitrary objects",
            )
        if isinstance(src, io.BytesIO):
            src.seek(0)
            obj = torch.load(src, map_location="cpu", weights_only=True)
        else:  # mmap: tensors are paged in when used, not all at once
            obj = torch.load(src, map_location="cpu", weights_only=True, mmap=True)
    # torch's weights_only unpickler raises UnpicklingError for a pickle that names more than plain tensors
    except (
        RuntimeError,
        EOFError,
        OSError,
        zipfile.BadZipFile,
        torch.serialization.pickle.UnpicklingError,
        ValueError,
    ) as err:
        raise _bad(
            path,
            "cannot be read (truncated or not a torch.save file)",
            "a complete torch.save file",
            f"{type(err).__name__}: {str(err).splitlines()[0]}",
            "re-create this sample (SpecForge's prepare_hidden_states.py skips existing files: delete it first)",
        ) from None
    if not isinstance(obj, dict):
        raise _bad(path, "is not a SpecForge sample", "a dict of tensors", type(obj).__name__)
    return obj


def _states(path: Path, data: dict, key: str) -> torch.Tensor:
    """`key` as [T, W] from SpecForge's [1, T, W] (the writer's unsqueeze(0))."""
    t = data.get(key)
    if t is None:
        extra = (
            " (written without --enable-aux-hidden-states: EAGLE-3 needs the aux taps)"
            if key == "aux_hidden_state"
            else ""
        )
        raise _bad(path, f"has no {key}{extra}", f"{key} [1, T, W]", f"keys {sorted(data)}")
    if (
        not isinstance(t, torch.Tensor)
        or not t.is_floating_point()
        or t.dim() not in (2, 3)
        or (t.dim() == 3 and t.shape[0] != 1)
    ):
        found = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise _bad(path, f"{key} has the wrong shape", f"{key}: floating [1, T, W]", found)
    return t.reshape(-1, t.shape[-1])


class SpecForgeDump:
    format, last_kind, declared_taps, missing_rows = "specforge", POST_NORM, None, 0

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        files = [p for p in self.root.rglob("*") if p.is_file() and _CKPT.search(p.name)]
        if not files:
            raise _bad(
                self.root,
                "holds no SpecForge sample files",
                "rows_*/data_*.ckpt or .ckpt.gz",
                "none",
                "point at the --output-path of SpecForge's prepare_hidden_states.py",
            )
        self._files = {_CKPT.sub("", str(p.relative_to(self.root))): p for p in files}

    def ids(self) -> list[str]:
        def key(sid: str) -> tuple[int, str]:  # data_{idx}: the writer's global sample index
            m = re.search(r"(\d+)$", sid)
            return (int(m.group(1)) if m else -1, sid)

        return sorted(self._files, key=key)

    def layout(self) -> str:
        return "SpecForge offline EAGLE-3 (aux_hidden_state [1, T, k*H] taps, hidden_state [1, T, H] post-norm)"

    def read(self, sid: str) -> DumpSample:
        path = self._files[sid]
        data = load_torch_file(path)
        ids, mask = (_tokens(path, k, data.get(k)) for k in ("input_ids", "loss_mask"))
        aux, last = _states(path, data, "aux_hidden_state"), _states(path, data, "hidden_state")  # [T, kH], [T, H]
        H = last.shape[-1]
        if aux.shape[-1] % H:
            raise _bad(
                path,
                "aux_hidden_state is not a concatenation of H-wide states",
                f"a width that is a multiple of hidden_state's {H}",
                f"width {aux.shape[-1]}",
            )
        _check_lengths(
            path,
            {
                "input_ids": len(ids),
                "loss_mask": len(mask),
                "aux_hidden_state": aux.shape[0],
                "hidden_state": last.shape[0],
            },
        )
        return DumpSample(sid, path, ids, mask, aux.reshape(len(ids), -1, H), last, POST_NORM)


# --------------------------------------------------------------------------------------------------
# speculators
# --------------------------------------------------------------------------------------------------


def _arrow_table(root: Path):  # -> pyarrow.Table (memory-mapped: rows are read when touched)
    try:
        import pyarrow as pa
        import pyarrow.ipc as ipc
    except ImportError:
        # datasets.load_from_disk reads the same files through pyarrow, so pyarrow alone is enough
        raise EaglewireError(
            "reading a speculators dump needs pyarrow (its Arrow dataset holds the loss masks)",
            expected="pyarrow importable",
            found="not installed",
            fix="pip install 'eaglewire[dumps]' (or pip install pyarrow)",
        ) from None
    state = read_json_object(root / "state.json", what="a datasets state.json")
    tables = []
    for entry in state.get("_data_files", []):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or Path(name).name != name:  # an Arrow file of this directory
            raise _bad(
                root / "state.json",
                "lists an Arrow file that is not a plain file name",
                "_data_files: [{filename: data-*.arrow}]",
                repr(entry)[:80],
            )
        path = root / name
        try:
            tables.append(ipc.open_stream(pa.memory_map(str(path))).read_all())
        except (OSError, pa.ArrowInvalid) as err:
            raise _bad(
                path, "is not a readable Arrow stream", "a datasets save_to_disk shard", f"{type(err).__name__}: {err}"
            ) from None
    if not tables:
        raise _bad(
            root / "state.json",
            "lists no Arrow files",
            "_data_files: [{filename: data-*.arrow}]",
            str(state.get("_data_files")),
        )
    table = pa.concat_tables(tables)
    missing = {"input_ids", "loss_mask"} - set(table.column_names)
    if missing:
        raise _bad(
            root,
            "the Arrow dataset lacks columns",
            "input_ids and loss_mask (speculators prepare-data)",
            f"columns {table.column_names}",
        )
    return table


class SpeculatorsDump:
    format, last_kind, declared_taps = "speculators", PRE_NORM, None

    def __init__(self, root: Path, states_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.states_dir = Path(states_dir) if states_dir else self.root / "hidden_states"
        if not (self.root / "state.json").is_file():
            raise _bad(
                self.root,
                "is not a speculators dataset",
                "state.json and data-*.arrow (save_to_disk)",
                "no state.json",
                "point at the --output of speculators prepare-data",
            )
        self._table = _arrow_table(self.root)
        files = self.states_dir.glob("hs_*.safetensors") if self.states_dir.is_dir() else []
        present = {int(m.group(1)) for p in files if (m := re.fullmatch(r"hs_(\d+)\.safetensors", p.name))}
        n = self._table.num_rows
        self._rows = [i for i in range(n) if i in present]
        self.missing_rows = n - len(self._rows)  # rows without states (generate-offline-data --max-samples)
        self.orphans = sorted(i for i in present if i >= n)

    def ids(self) -> list[str]:
        return [f"row-{i}" for i in self._rows]

    def layout(self) -> str:
        return "speculators offline data (hidden_states [T, k+1, H]: k taps, then the last layer pre-norm)"

    def _row(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        cols = [self._table.column(c)[i].values.to_numpy(zero_copy_only=False) for c in ("input_ids", "loss_mask")]
        return torch.tensor(cols[0], dtype=torch.long), torch.tensor(cols[1], dtype=torch.long)  # copies: [T]

    def read(self, sid: str) -> DumpSample:
        i = int(sid.removeprefix("row-"))
        path = self.states_dir / f"hs_{i}.safetensors"
        data = read_safetensors_file(path, what="a speculators hidden-state file")
        hs = data.get("hidden_states")
        if hs is None or "token_ids" not in data or hs.dim() != 3 or hs.shape[1] < 2:
            found = f"keys {sorted(data)}" + (f", hidden_states {tuple(hs.shape)}" if hs is not None else "")
            raise _bad(
                path,
                "is not a speculators hidden-state file",
                "hidden_states [T, k+1, H] (taps, then the last layer) and token_ids [T]",
                found,
            )
        if "hidden_states_scales" in data:  # the fp8 connector's payload (hs_connectors/fp8_utils.py)
            hs = hs.float() * data["hidden_states_scales"].float()  # [T, k+1, H] * [T, 1, 1]
        ids, mask = self._row(i)
        token_ids = _tokens(path, "token_ids", data["token_ids"])
        _check_lengths(
            path,
            {
                "input_ids (Arrow row)": len(ids),
                "loss_mask (Arrow row)": len(mask),
                "token_ids": len(token_ids),
                "hidden_states": hs.shape[0],
            },
        )
        if not torch.equal(token_ids, ids):
            raise _bad(
                path,
                f"token_ids differ from Arrow row {i}'s input_ids (speculators drops such rows)",
                "the same tokens",
                f"first difference at position {int((token_ids != ids).nonzero()[0])}",
                "the hidden states were generated for another dataset; regenerate them",
            )
        return DumpSample(sid, path, ids, mask, hs[:, :-1], hs[:, -1], PRE_NORM)


# --------------------------------------------------------------------------------------------------
# eaglewire feature directories (for inspect)
# --------------------------------------------------------------------------------------------------


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
    if src.is_dir() and any(_CKPT.search(p.name) for p in src.rglob("*")):
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
