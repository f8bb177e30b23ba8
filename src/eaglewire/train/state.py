"""Resumable trainer state, written atomically and without pickle.

    OUT/checkpoints/step-000100/draft/       native draft checkpoint (eaglewire.export.checkpoint)
    OUT/checkpoints/step-000100/optim.safetensors   optimizer tensors (state.{param}.{exp_avg,momentum_buffer,...})
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

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.contract import WiringContract
from eaglewire.errors import CheckpointError
from eaglewire.train.config import TrainConfig
from eaglewire.safeio import (
    atomic_save_safetensors,
    atomic_write_json,
    atomic_write_text,
    field_of,
    open_safetensors,
    read_json_object,
)
from eaglewire.target.protocol import TargetTensors


def _optim_tensors(opt: torch.optim.Optimizer, names: dict[int, str]) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors = {f"state.{names[i]}.{k}": v for i, st in sd["state"].items() for k, v in st.items()}
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
        for g in sd["param_groups"]
    ]
    return tensors, {"param_groups": groups}


def save_state(
    out: Path,
    step: int,
    draft: Any,
    contract: WiringContract,
    opt: torch.optim.Optimizer,
    param_names: list[str],
    config: dict[str, Any],
    keep: int = 2,
) -> Path:
    root = Path(out) / "checkpoints"
    d = root / f"step-{step:06d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    save_checkpoint(draft, contract, d / "draft")  # any family's (keyed by the contract's)
    tensors, meta = _optim_tensors(opt, dict(enumerate(param_names)))
    atomic_save_safetensors(tensors, d / "optim.safetensors", {"format": "eaglewire.optim/1"})
    atomic_write_json(d / "trainer.json", {"step": step, "config": config, "optimizer": meta})
    atomic_write_text(root / "latest", d.name)  # the commit point
    for old in prunable(root, d, keep):
        shutil.rmtree(old)
    return d


def prunable(root: Path, current: Path, keep: int) -> list[Path]:
    """The checkpoints of `root` older than `current` beyond the `keep - 1` newest of them. `current` (the one
    `latest` names) is never among them, and neither is a directory with a later step: such a one is not this
    run's history (a different run's, copied in), so it is not ours to delete."""
    step = _step_of(current)
    older = sorted(p for p in root.glob("step-*") if p != current and _step_of(p) is not None and _step_of(p) < step)
    return older[: max(0, len(older) - (keep - 1))]


def _step_of(d: Path) -> int | None:
    tail = d.name.removeprefix("step-")
    return int(tail) if tail.isdigit() else None


# What a training run writes into --out; a fresh run finding any of these would overwrite or prune them.
RUN_FILES = ("checkpoints", "draft", "metrics.jsonl", "summary.json", "snapshots", "training.png")


def refuse_to_overwrite(out: Path, *, any_entry: bool) -> None:
    """A fresh (not --resume) run must not destroy an earlier one. `any_entry`: the CLI refuses every non-empty
    --out; the library refuses one holding a checkpoint or a final draft (a pipeline's own work dir may hold
    the metrics of a run killed before its first checkpoint, which a fresh start may replace)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"--out {out} is a file, not a run directory",
            expected="a new or empty directory",
            found="a file",
            fix="pass a new --out directory",
        )
    if not out.is_dir():
        return
    found = (
        sorted(p.name for p in out.iterdir())
        if any_entry
        else [n for n in ("checkpoints", "draft") if (out / n).exists() and any((out / n).iterdir())]
    )
    if found:
        raise CheckpointError(
            f"--out {out} already holds a run; a fresh run there would overwrite it",
            expected="an empty or new --out directory (or --resume to continue that run)",
            found=f"{out} contains {', '.join(found[:6])}" + (" ..." if len(found) > 6 else ""),
            fix=f"pass a new --out (eaglewire refuses rather than writing beside it), add "
            f"--resume to continue the run in {out}, or remove {out} yourself",
        )


def latest_state(out: Path) -> Path | None:
    """The checkpoint `latest` names, or None when there is none; a pointer to a missing or unreadable one is
    an error (resuming from nothing would silently restart the run)."""
    pointer = Path(out) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"cannot read the checkpoint pointer {pointer}",
            expected="a step-NNNNNN name",
            found=f"{type(err).__name__}: {err}",
            fix="write the newest complete checkpoint's directory name into it, or start a new --out",
        ) from None
    d = pointer.parent / name
    if _step_of(d) is None or not (d / "trainer.json").is_file():
        raise CheckpointError(
            f"{pointer} names a checkpoint that is not there",
            expected=f"a complete checkpoint directory {d} (with trainer.json)",
            found=f"latest = {name!r}; present: {sorted(p.name for p in pointer.parent.glob('step-*')) or 'none'}",
            fix="point latest at a complete step-NNNNNN directory, or start a new --out",
        )
    return d


def load_state(
    d: Path,
    draft: Any,
    target: TargetTensors,
    opt: torch.optim.Optimizer,
    param_names: list[str],
    config: dict[str, Any],
) -> int:
    """Restore weights into `draft` and state into `opt` (built on draft's parameters); returns the step."""
    meta = read_json_object(d / "trainer.json", what="a trainer state", error=CheckpointError)
    for key, kind in (("step", int), ("config", dict), ("optimizer", dict)):
        field_of(meta, key, kind, where=str(d / "trainer.json"), error=CheckpointError)
    # a knob added after the checkpoint was written ran at its default there (e.g. `family`: eagle3)
    stored = {**{k: v for k, v in TrainConfig().to_dict().items() if k not in meta["config"]}, **meta["config"]}
    if stored != config:
        diff = sorted(k for k in {*config, *stored} if stored.get(k) != config.get(k))
        raise CheckpointError(
            f"--resume from {d} with different training settings",
            expected=json.dumps({k: stored.get(k) for k in diff}),
            found=json.dumps({k: config.get(k) for k in diff}),
            fix="resume with the settings of the interrupted run, or start a new --out",
        )
    loaded = load_checkpoint(d / "draft", target=target)  # strict: keys, shapes, contract, vocab map
    with torch.no_grad():
        for name, p in draft.state_dict().items():
            p.copy_(loaded.state_dict()[name])
    index = {n: i for i, n in enumerate(param_names)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    with open_safetensors(d / "optim.safetensors", what="optimizer state", error=CheckpointError) as f:
        for key in f.keys():
            name, _, field = key.removeprefix("state.").rpartition(".")
            if name not in index:
                raise CheckpointError(
                    f"{d / 'optim.safetensors'}: state for an unknown parameter",
                    expected=f"state.<one of {len(index)} parameters>.<field>",
                    found=key,
                    fix="resume with the code and settings that wrote it, or a new --out",
                )
            state.setdefault(index[name], {})[field] = f.get_tensor(key)
    try:
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in meta["optimizer"]["param_groups"]]
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (KeyError, TypeError, ValueError) as err:  # torch's own checks of the groups' shape and sizes
        raise CheckpointError(
            f"{d / 'trainer.json'}: optimizer state does not fit this draft",
            expected="the param groups this run's optimizer has",
            found=f"{type(err).__name__}: {err}",
            fix="resume with the code and settings that wrote it, or a new --out",
        ) from None
    return int(meta["step"])
