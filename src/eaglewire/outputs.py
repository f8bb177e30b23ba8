"""No command destroys what it did not create: the one writer of output folders and the one lock on outputs.

- `output_lock(path)`: one writer per output folder or appended file. An `flock` on `.NAME.lock` beside it
  (released by the kernel when the holder dies, so a kill never leaves a stale lock), holding who took it
  (pid, host, command); a second writer is refused with those.
- `check_output_dir` / `replace_dir`: an existing output is replaced only when it is this writer's own earlier
  output (recognised by its content, holding nothing the writer would not write) or with `force`; never an
  input of the command, a folder holding one, the working directory or a folder above it, even with `force`.
  The new folder is written beside `out`, then swapped in; the old one is kept until the swap is done. A swap
  cut between its two renames is undone, and temp folders a killed writer left are removed, by the next write
  (under the lock, so nobody else is writing them).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from eaglewire.errors import EaglewireError
from eaglewire.paths import resolve_path

_held: dict[str, int] = {}  # lock paths this process holds -> depth (re-entrant within one process)


def lock_path(path: Path) -> Path:
    path = Path(path).absolute()
    return path.parent / f".{path.name}.lock"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its lock file names no holder yet)"


@contextmanager
def output_lock(path: Path | str) -> Iterator[None]:
    """Hold the write lock of output `path` (a folder or an appended file) for the block."""
    key = str(lock_path(Path(path)))
    if key in _held:  # this process already writes it (a command calling a library writer)
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    lock = Path(key)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(lock, Path(path))
    _held[key] = 1
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(sys.argv)[:500],
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        yield
    finally:
        del _held[key]
        try:
            os.unlink(lock)  # while still holding it: a waiter that opened it sees another inode and retries
        except FileNotFoundError:
            pass
        os.close(fd)


def _acquire(lock: Path, path: Path) -> int:
    for _ in range(50):  # each retry means a holder released between our open and flock; bounded
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            os.close(fd)
            raise EaglewireError(
                f"{path} is being written by another process",
                expected="one writer at a time",
                found=f"held by {who} (lock {lock})",
                fix="wait for that command to finish or stop it, or pass another output path",
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise EaglewireError(
        f"cannot lock {path}",
        expected="its lock file to stay in place",
        found=f"{lock} replaced 50 times in a row",
        fix="check what else writes that folder",
    )


# ------------------------------------------------------------------------------------------------------
# Replacing an output folder
# ------------------------------------------------------------------------------------------------------


def _inside(a: Path, b: Path) -> bool:
    """a is b or a folder holding b."""
    return a == b or a in b.parents


def check_output_dir(
    out: Path,
    *,
    names: Iterable[str],
    owned: Callable[[Path], bool],
    force: bool = False,
    inputs: Iterable[Path | str] = (),
    what: str = "output",
) -> None:
    """Refuse an `out` this writer may not replace. `names`: the entries the writer puts in it; `owned(out)`:
    it recognises out's content as its own kind of output."""
    out = Path(out)
    real = resolve_path(out, "--out")
    for inp in inputs:
        if _inside(real, resolve_path(inp, "input")):
            raise EaglewireError(
                f"--out {out} is the input {inp} or holds it",
                expected=f"an {what} folder apart from the command's inputs",
                found=f"{out} -> {real}",
                fix="pass another --out (--force never replaces an input or a folder holding one)",
            )
    cwd = Path.cwd().resolve()
    if _inside(real, cwd) or real == Path(real.anchor) or real == Path.home().resolve():
        raise EaglewireError(
            f"--out {out} is the working directory, the home directory, or a folder above it",
            expected=f"a folder of its own for the {what}",
            found=str(real),
            fix="pass a new folder, e.g. --out ./export (--force never replaces these)",
        )
    if not out.exists() and not out.is_symlink() or force:
        return
    if out.is_dir() and not out.is_symlink():
        entries = sorted(p.name for p in out.iterdir())
        foreign = [e for e in entries if e not in set(names)]
        if not entries or (not foreign and owned(out)):
            return
        found = f"{out} holds {', '.join((foreign or entries)[:6])}" + (" ..." if len(foreign or entries) > 6 else "")
        found += "" if foreign else f" (not an eaglewire {what})"
    else:
        found = f"{out} is a {'symlink' if out.is_symlink() else 'file'}"
    raise EaglewireError(
        f"--out {out} exists and is not an earlier {what} of this command",
        expected=f"a new or empty folder, or an earlier {what} (holding only {', '.join(sorted(set(names)))})",
        found=found,
        fix=f"pass a new --out, or --force to replace {out} (its content is then deleted)",
    )


def recover(out: Path) -> None:
    """Under the lock: undo a swap cut between its renames, remove temp folders a killed writer left."""
    out = Path(out)
    if not out.parent.is_dir():
        return
    stale = [p for p in out.parent.iterdir() if p.name.startswith((f".{out.name}.tmp-", f".{out.name}.old-"))]
    for p in sorted(stale, key=lambda p: ".old-" not in p.name):  # temp folders first, then old ones
        if ".old-" in p.name and not out.exists() and not out.is_symlink():
            os.rename(p, out)  # the old output was swapped out, the new one never in: it is still the output
        else:
            _remove(p)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def replace_dir(
    out: Path,
    fill: Callable[[Path], None],
    *,
    names: Iterable[str],
    owned: Callable[[Path], bool],
    force: bool = False,
    inputs: Iterable[Path | str] = (),
    what: str = "output",
) -> Path:
    """Write `out` with `fill(tmp)` into a folder beside it, then swap it in (see the module note)."""
    out, names = Path(out), list(names)
    check_output_dir(out, names=names, owned=owned, force=force, inputs=inputs, what=what)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        recover(out)
        check_output_dir(out, names=names, owned=owned, force=force, inputs=inputs, what=what)  # now locked
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            fill(tmp)
            swap_in(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return out


def swap_in(tmp: Path, out: Path) -> None:
    """Move the finished `tmp` to `out`; an existing `out` is renamed aside first and removed only after."""
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        _remove(old)
