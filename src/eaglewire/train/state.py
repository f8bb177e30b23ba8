"""Resumable trainer state, written atomically and without pickle.

    OUT/checkpoints/step-000100/draft/       native draft checkpoint (eaglewire.export.checkpoint)
    OUT/checkpoints/step-000100/optim.safetensors   AdamW tensors (state.{param}.{exp_avg,...})
    OUT/checkpoints/step-000100/trainer.json        step, config, optimizer hyper-parameters
    OUT/checkpoints/latest                          name of the newest complete checkpoint
A checkpoint directory is complete only once `latest` names it (written last, by rename).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.contract import WiringContract
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError
from eaglewire.safeio import atomic_save_safetensors, atomic_write_json, atomic_write_text


def _optim_tensors(opt: torch.optim.Optimizer, names: dict[int, str]) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors = {f"state.{names[i]}.{k}": v for i, st in sd["state"].items() for k, v in st.items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
              for g in sd["param_groups"]]
    return tensors, {"param_groups": groups}


def save_state(out: Path, step: int, draft: Eagle3Draft, contract: WiringContract, opt: torch.optim.Optimizer,
               param_names: list[str], config: dict[str, Any], keep: int = 2) -> Path:
    root = Path(out) / "checkpoints"
    d = root / f"step-{step:06d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    save_checkpoint(draft, contract, d / "draft")
    tensors, meta = _optim_tensors(opt, dict(enumerate(param_names)))
    atomic_save_safetensors(tensors, d / "optim.safetensors", {"format": "eaglewire.optim/1"})
    atomic_write_json(d / "trainer.json", {"step": step, "config": config, "optimizer": meta})
    atomic_write_text(root / "latest", d.name)  # the commit point
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old)
    return d


def latest_state(out: Path) -> Path | None:
    pointer = Path(out) / "checkpoints" / "latest"
    return pointer.parent / pointer.read_text().strip() if pointer.exists() else None


def load_state(d: Path, draft: Eagle3Draft, target: Any, opt: torch.optim.Optimizer, param_names: list[str],
               config: dict[str, Any]) -> int:
    """Restore weights into `draft` and state into `opt` (built on draft's parameters); returns the step."""
    meta = json.loads((d / "trainer.json").read_text())
    if meta["config"] != config:
        diff = sorted(k for k in config if meta["config"].get(k) != config.get(k))
        raise CheckpointError(f"--resume from {d} with different training settings",
                              expected=json.dumps({k: meta["config"].get(k) for k in diff}),
                              found=json.dumps({k: config.get(k) for k in diff}),
                              fix="resume with the settings of the interrupted run, or start a new --out")
    loaded = load_checkpoint(d / "draft", target=target)  # strict: keys, shapes, contract, vocab map
    with torch.no_grad():
        for name, p in draft.state_dict().items():
            p.copy_(loaded.state_dict()[name])
    index = {n: i for i, n in enumerate(param_names)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    with safe_open(str(d / "optim.safetensors"), framework="pt") as f:
        for key in f.keys():
            name, field = key.removeprefix("state.").rsplit(".", 1)
            state.setdefault(index[name], {})[field] = f.get_tensor(key)
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in meta["optimizer"]["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    return int(meta["step"])
