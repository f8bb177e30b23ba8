"""User cache directory and directories that are either complete or absent.

A conversion killed half-way must never be mistaken for a finished one: `ensure_dir` builds into a
temporary sibling, writes a completion marker listing every file and its size LAST, then renames the
directory into place. On the next call a directory without a valid marker (or whose files no longer
match it) is rebuilt beside it and swapped in.

The cache checks what it serves: the marker holds each file's size, a sampled sha256 (16 blocks of 64 KiB,
checked on every use), its full sha256 and the modification time it was last fully hashed at. A file whose
modification time moved is hashed in full (a write in place moves it), so a file damaged with its size kept
(a zeroed region, a flipped byte) is rebuilt, never loaded, while an unchanged one costs a stat and the sampled
blocks per use (benchmarks/architecture/cache_digest.py measures both). The marker is validated like any other file:
damaged, it means "incomplete", never a traceback. A marker written before digests were recorded gets them on
first use (nothing to compare against yet).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

import platformdirs

from eaglewire.outputs import swap_in


def sampled_digest(path: Path) -> str:
    from eaglewire.digests import sampled_digest as digest  # late: importing the cache module stays light

    return digest(path)


def full_digest(path: Path) -> str:
    from eaglewire.digests import full_digest as digest

    return digest(path)


MARKER = ".eaglewire-complete.json"


def cache_root() -> Path:
    """`$EAGLEWIRE_CACHE` if set, else the platform's user cache dir (e.g. ~/.cache/eaglewire)."""
    env = os.environ.get("EAGLEWIRE_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("eaglewire"))


def _file_sizes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER
    }


def _digests(root: Path, files: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "sampled": sampled_digest(root / name),
            "sha256": full_digest(root / name),
            "mtime_ns": (root / name).stat().st_mtime_ns,
        }
        for name in files
    }


def _read_marker(path: Path) -> dict[str, Any] | None:
    """The marker if it is one (an object with a fingerprint, {file: size} and optionally {file: digests}),
    else None: a damaged marker makes the directory incomplete."""
    try:
        meta = json.loads((path / MARKER).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or "fingerprint" not in meta or not isinstance(meta.get("files"), dict):
        return None
    if not all(isinstance(k, str) and type(v) is int for k, v in meta["files"].items()):
        return None
    digests = meta.get("digests")
    if digests is not None and not (
        isinstance(digests, dict)
        and set(digests) == set(meta["files"])
        and all(
            isinstance(d, dict)
            and isinstance(d.get("sampled"), str)
            and isinstance(d.get("sha256"), str)
            and type(d.get("mtime_ns")) is int
            for d in digests.values()
        )
    ):
        return None
    return meta


def check_dir(path: Path, fingerprint: dict[str, Any]) -> str | None:
    """None when `path` is complete for `fingerprint` and its files are as built, else why it is not."""
    meta = _read_marker(path) if path.is_dir() else None
    if meta is None:
        return "no valid completion marker" if path.exists() else "not built yet"
    if meta["fingerprint"] != fingerprint:
        return "built from another source"
    files = meta["files"]
    if not files or files != _file_sizes(path):
        return "files missing, added or of another size"
    digests = meta.get("digests")
    if digests is None:  # an older marker: record what is there now
        _write_marker(path, {**meta, "digests": _digests(path, files)})
        return None
    moved = {}
    for name, d in digests.items():
        if sampled_digest(path / name) != d["sampled"]:
            return f"{name} changed since it was built (sampled sha256)"
        mtime = (path / name).stat().st_mtime_ns
        if mtime != d["mtime_ns"]:  # written since it was last hashed in full: hash it in full now
            if full_digest(path / name) != d["sha256"]:
                return f"{name} changed since it was built (sha256)"
            moved[name] = {**d, "mtime_ns": mtime}
    if moved:  # touched, not changed (e.g. copied without its times)
        _write_marker(path, {**meta, "digests": {**digests, **moved}})
    return None


def is_complete(path: Path, fingerprint: dict[str, Any]) -> bool:
    """True only if `path` has a valid marker for this fingerprint and every file is as it was built."""
    return check_dir(path, fingerprint) is None


def _write_marker(directory: Path, meta: dict[str, Any]) -> None:
    """Written beside the directory, then renamed in: a reader listing it never sees a temp file."""
    tmp = directory.parent / f".{directory.name}{MARKER}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, directory / MARKER)


def ensure_dir(path: Path, fingerprint: dict[str, Any], build: Callable[[Path], None]) -> tuple[Path, bool]:
    """Return (path, built_now). Calls `build(tmp_dir)` only when `path` is missing, incomplete or damaged
    (then rebuilt beside it and swapped in, saying why on stderr)."""
    why = check_dir(path, fingerprint)
    if why is None:
        return path, False
    if path.exists() or path.is_symlink():
        print(f"note: rebuilding {path}: {why}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        build(tmp)
        files = _file_sizes(tmp)
        marker = {"fingerprint": fingerprint, "files": files, "digests": _digests(tmp, files)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        swap_in(tmp, path)  # a damaged or stale one is moved aside, then removed
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path, True
