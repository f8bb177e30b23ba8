"""Small hidden-state dumps in SpecForge's and speculators' layouts, from a tiny target, for tests.

The states are the target's own (eaglewire capture of every boundary on one unpadded sequence), stored
as each tool stores them; `stored` picks which boundaries go where the tool puts its taps, so a dump of
the seeds' shifted taps is one argument away. Layouts (see eaglewire/capture/dumps/specforge.py and speculators.py for the tools'
source files): SpecForge's writer (scripts/prepare_hidden_states.py) needs SGLang and a GPU, so the .ckpt
files are written here as it writes them (torch.save of {input_ids [T], loss_mask [T], hidden_state
[1, T, H] post-norm, aux_hidden_state [1, T, k*H]}), and SpecForge's own loader reads them back in a test.
speculators' hidden-state files are written by vLLM (its extract_hidden_states connector), so hs_{row}
.safetensors {hidden_states [T, k+1, H], token_ids [T]} is written here; its Arrow dataset is written by
the real `datasets.save_to_disk` in the speculators venv (tests/clients/speculators_dump.py), or by pyarrow
in the same stream format when that venv is absent.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from eaglewire.data.samples import Sample
from eaglewire.capture.hooks import capture
from eaglewire.target.loader import Target

CLIENTS = Path(os.environ.get("EAGLEWIRE_CACHE", Path.home() / ".cache" / "eaglewire")) / "client-venvs"


def client_python(name: str) -> str | None:
    """The client venv's python: EAGLEWIRE_<NAME>_PYTHON (as .ci/run sets it), else the default venv path."""
    env = os.environ.get(f"EAGLEWIRE_{name.upper()}_PYTHON")
    default = CLIENTS / name / "bin" / "python"
    return env or (str(default) if default.is_file() else None)


def run_client(py: str, script: str, *args: str) -> str:
    """Run tests/clients/SCRIPT in a client venv; our PYTHONPATH stays out (it would shadow the venv's packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [py, str(Path(__file__).parent / "clients" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def true_states(target: Target, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All boundaries [T, L+1, H] (0 = embedding, L = last layer pre-norm) and the final-norm state [T, H]."""
    L, H = target.num_layers, target.hidden_size
    cap = capture(target, tuple(range(L + 1)), ids[None])
    return cap.taps[0].reshape(len(ids), L + 1, H), cap.final_hidden[0]


def specforge_path(root: Path, i: int, group: int = 2000, compress: bool = False) -> Path:
    g = i // group * group
    return Path(root) / f"rows_{g}-{g + group}" / f"data_{i}.ckpt{'.gz' if compress else ''}"


def save_specforge_sample(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        buf = io.BytesIO()
        torch.save(data, buf)
        path.write_bytes(gzip.compress(buf.getvalue()))
    else:
        torch.save(data, path)


def write_specforge(
    root: Path,
    target: Target,
    samples: list[Sample],
    stored: Sequence[int],
    *,
    last: str = "post-norm",
    dtype: torch.dtype = torch.float32,
    compress: bool = False,
    group: int = 2000,
) -> list[Path]:
    """One data_{i}.ckpt per sample; `last="pre-norm"` stores boundary L where SpecForge stores post-norm."""
    paths = []
    for i, s in enumerate(samples):
        states, post = true_states(target, s.input_ids)
        hidden = post if last == "post-norm" else states[:, -1]  # [T, H]
        data = {
            "input_ids": s.input_ids.clone(),
            "loss_mask": s.loss_mask.clone(),  # DataPoint's field order
            "hidden_state": hidden[None].to(dtype).clone(),  # [1, T, H]
            "aux_hidden_state": states[:, list(stored)].flatten(1)[None].to(dtype).clone(),
        }  # [1, T, k*H]
        paths.append(specforge_path(root, i, group, compress))
        save_specforge_sample(paths[-1], data)
    return paths


def write_speculators_states(
    root: Path,
    target: Target,
    samples: list[Sample],
    stored: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    skip: Sequence[int] = (),
) -> list[Path]:
    """DIR/hidden_states/hs_{row}.safetensors: the taps then boundary L (vLLM's extra last-layer id)."""
    out = Path(root) / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, s in enumerate(samples):
        if i in skip:
            continue
        states, _ = true_states(target, s.input_ids)
        hs = states[:, [*stored, target.num_layers]].to(dtype).contiguous()  # [T, k+1, H]
        paths.append(out / f"hs_{i}.safetensors")
        save_file({"hidden_states": hs, "token_ids": s.input_ids.clone()}, str(paths[-1]))
    return paths


def write_speculators_arrow(root: Path, samples: list[Sample], real_tool: bool = False) -> Path | None:
    """The Arrow dataset. With `real_tool` and the speculators venv, written by datasets.save_to_disk and read
    back by speculators' ArrowDataset, whose output file is returned (~10 s: one test does it); otherwise
    written by pyarrow in the same stream format (None returned)."""
    rows = [{"input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()} for s in samples]
    py = client_python("speculators") if real_tool else None
    if py:
        (Path(root) / "rows.json").write_text(json.dumps(rows))
        check = Path(root).parent / f"{Path(root).name}-speculators-read.safetensors"
        run_client(py, "speculators_dump.py", str(root), str(Path(root) / "rows.json"), str(check))
        return check
    import pyarrow as pa  # the caller skips when neither is there
    import pyarrow.ipc as ipc

    table = pa.table(
        {
            "input_ids": [r["input_ids"] for r in rows],
            "loss_mask": [r["loss_mask"] for r in rows],
            "seq_len": [len(r["input_ids"]) for r in rows],
        }
    )
    with ipc.new_stream(str(Path(root) / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table)
    (Path(root) / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return None
