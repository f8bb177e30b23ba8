"""Atomic file writes. A killed process leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def _tmp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy a file (and a `.meta.json` sidecar next to it, if any) so a kill never leaves half a copy."""
    import shutil

    for a, b in ((Path(src), Path(dst)), (Path(f"{src}.meta.json"), Path(f"{dst}.meta.json"))):
        if a.is_file():
            b.parent.mkdir(parents=True, exist_ok=True)
            tmp = _tmp_for(b)
            shutil.copyfile(a, tmp)
            os.replace(tmp, b)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(tensors: dict[str, torch.Tensor], path: Path,
                            metadata: dict[str, str] | None = None) -> None:
    """safetensors.save_file to a temp name, then rename. Tensors are made contiguous (required)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)
