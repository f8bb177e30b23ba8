"""Digests of files a command reuses (a run's stage outputs, the converted target, feature shards): size plus a
sampled hash (the whole file when small), cheap enough to check on every reuse of multi-GiB files; and the
full hash the benchmark compares it with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

_SAMPLE, _SAMPLES = 64 << 10, 16  # 16 blocks of 64 KiB, evenly spread, first and last included


def sampled_digest(path: Path | str) -> str:
    """'size:sha256' of the whole file up to 1 MiB, else of 16 blocks of 64 KiB spread over it (the size, the
    header, the tail and every 1/15 of the body: truncation, a rewrite or a zeroed region that hits a block)."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _SAMPLE * _SAMPLES:
            h.update(f.read())
        else:
            for i in range(_SAMPLES):
                f.seek((size - _SAMPLE) * i // (_SAMPLES - 1))
                h.update(f.read(_SAMPLE))
    return f"{size}:{h.hexdigest()}"


def full_digest(path: Path | str) -> str:
    """'size:sha256' of every byte (the benchmark's comparison for `sampled_digest`)."""
    path = Path(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return f"{path.stat().st_size}:{h.hexdigest()}"


def tree_digest(root: Path | str, skip: Callable[[str], bool] = lambda name: False) -> dict[str, str]:
    """{relative path: sampled_digest} of every file under `root` (lock files and names `skip` says skipped)."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): sampled_digest(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock") and not skip(p.name)
    }
