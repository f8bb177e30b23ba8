"""User cache directory and directories that are either complete or absent.

A conversion killed half-way must never be mistaken for a finished one: `ensure_dir` builds into a
temporary sibling, writes a completion marker listing every file and its size LAST, then renames the
directory into place. On the next call a directory without a valid marker (or whose files no longer
match it) is deleted and rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import platformdirs

MARKER = ".eaglewire-complete.json"


def cache_root() -> Path:
    """`$EAGLEWIRE_CACHE` if set, else the platform's user cache dir (e.g. ~/.cache/eaglewire)."""
    env = os.environ.get("EAGLEWIRE_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("eaglewire"))


def _file_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER}


def is_complete(path: Path, fingerprint: dict[str, Any]) -> bool:
    """True only if `path` has a marker for this fingerprint and every listed file has its size."""
    marker = path / MARKER
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if meta.get("fingerprint") != fingerprint:
        return False
    files = meta.get("files", {})
    return bool(files) and files == _file_sizes(path)


def ensure_dir(path: Path, fingerprint: dict[str, Any], build: Callable[[Path], None]) -> tuple[Path, bool]:
    """Return (path, built_now). Calls `build(tmp_dir)` only when `path` is missing or incomplete."""
    if is_complete(path, fingerprint):
        return path, False
    if path.exists():
        shutil.rmtree(path)  # half-written or stale: never used, always rebuilt
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        build(tmp)
        marker = {"fingerprint": fingerprint, "files": _file_sizes(tmp)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        try:
            os.rename(tmp, path)
        except OSError:
            # Another process finished first; keep its copy if it is complete.
            if not is_complete(path, fingerprint):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path, True
