"""speculators (vllm-project/speculators 0.9.0) offline data: `DIR/` an Arrow dataset from `save_to_disk`
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

import re
from pathlib import Path

import torch

from eaglewire.capture.dumps.sample import PRE_NORM, DumpSample, bad, check_lengths, token_vector
from eaglewire.errors import EaglewireError
from eaglewire.safeio import read_json_object, read_safetensors_file


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
            raise bad(
                root / "state.json",
                "lists an Arrow file that is not a plain file name",
                "_data_files: [{filename: data-*.arrow}]",
                repr(entry)[:80],
            )
        path = root / name
        try:
            tables.append(ipc.open_stream(pa.memory_map(str(path))).read_all())
        except (OSError, pa.ArrowInvalid) as err:
            raise bad(
                path, "is not a readable Arrow stream", "a datasets save_to_disk shard", f"{type(err).__name__}: {err}"
            ) from None
    if not tables:
        raise bad(
            root / "state.json",
            "lists no Arrow files",
            "_data_files: [{filename: data-*.arrow}]",
            str(state.get("_data_files")),
        )
    table = pa.concat_tables(tables)
    missing = {"input_ids", "loss_mask"} - set(table.column_names)
    if missing:
        raise bad(
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
            raise bad(
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
            raise bad(
                path,
                "is not a speculators hidden-state file",
                "hidden_states [T, k+1, H] (taps, then the last layer) and token_ids [T]",
                found,
            )
        if "hidden_states_scales" in data:  # the fp8 connector's payload (hs_connectors/fp8_utils.py)
            hs = hs.float() * data["hidden_states_scales"].float()  # [T, k+1, H] * [T, 1, 1]
        ids, mask = self._row(i)
        token_ids = token_vector(path, "token_ids", data["token_ids"])
        check_lengths(
            path,
            {
                "input_ids (Arrow row)": len(ids),
                "loss_mask (Arrow row)": len(mask),
                "token_ids": len(token_ids),
                "hidden_states": hs.shape[0],
            },
        )
        if not torch.equal(token_ids, ids):
            raise bad(
                path,
                f"token_ids differ from Arrow row {i}'s input_ids (speculators drops such rows)",
                "the same tokens",
                f"first difference at position {int((token_ids != ids).nonzero()[0])}",
                "the hidden states were generated for another dataset; regenerate them",
            )
        return DumpSample(sid, path, ids, mask, hs[:, :-1], hs[:, -1], PRE_NORM)
