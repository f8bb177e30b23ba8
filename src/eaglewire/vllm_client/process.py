"""A served engine's process group (vLLM's here, llama.cpp's in serve/llamacpp.py): a free port, a start in its
own session that ends when this process ends (parent-death signal, and a watchdog for a paused group), and the
/proc reading that tells when SIGSTOP has stopped every thread of the group."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Self

from eaglewire.errors import EaglewireError

PAUSE_TIMEOUT = 10.0  # s for every thread of a paused server to reach state T (they take milliseconds)


def _die_with_parent(nice: int = 0) -> None:
    """In the child, before exec: lower its priority by `nice`; ask Linux to send SIGTERM when the parent
    exits (prctl PR_SET_PDEATHSIG). That reaches the API server only, and a paused one holds it pending:
    the watchdog (`_WATCHDOG`) is what ends a group whose parent died."""
    import ctypes

    if nice:
        os.nice(nice)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux/glibc: stop() in __exit__ remains the way the server ends


# Run by a watchdog process beside each server (outside its group, never paused): it blocks on a pipe only
# this process writes to, and on EOF (this process ended, however it ended) resumes and kills the group.
# Why: a paused server holds the parent-death SIGTERM pending forever, and its engine core gets none.
_WATCHDOG = """
import os, signal, sys
sys.stdin.buffer.read()
for sig in (signal.SIGCONT, signal.SIGKILL):
    try:
        os.killpg(int(sys.argv[1]), sig)
    except ProcessLookupError:
        pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A served engine's process as a context manager (vLLM's here, llama.cpp's in serve/llamacpp.py): started on
    enter, stopped on exit; `log_path` holds what it printed."""

    log_path: Path
    LOG_LINES = 40  # lines of its log an error quotes

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def log_tail(self, n: int | None = None) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-(n or self.LOG_LINES) :])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stat(path: str) -> list[str]:
    """A /proc .../stat file after the command name: [state, ppid, pgid, ...]; [] for one gone meanwhile."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _group_states(pgid: int) -> dict[int, str]:
    """{tid: state} of every thread of the live processes in group `pgid`, read from /proc ({} where there is
    none). Threads, not processes: /proc/PID/stat is the main thread's, and an engine core's OpenMP
    workers can still be running while it reads 'T'."""
    states = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        fields = _stat(f"/proc/{name}/stat") if name.isdigit() else []
        if fields and int(fields[2]) == pgid:
            try:
                tids = os.listdir(f"/proc/{name}/task")
            except OSError:  # gone meanwhile
                continue
            for tid in tids:
                if st := _stat(f"/proc/{name}/task/{tid}/stat"):
                    states[int(tid)] = st[0]
    return states


def _wait_group_stopped(pgid: int, timeout: float) -> None:
    """Block until no thread of group `pgid` is running (each stopped 'T', traced 't', or dead 'Z'/'X');
    raise after `timeout` s. Without /proc (not Linux) it cannot look and returns at once."""
    deadline = time.monotonic() + timeout
    while True:
        running = {tid: st for tid, st in _group_states(pgid).items() if st not in "TtZX"}
        if not running:
            return
        if time.monotonic() > deadline:
            raise EaglewireError(
                "the vLLM server did not stop on SIGSTOP",
                expected=f"every thread of group {pgid} in state T (stopped)",
                found=f"{{tid: state}} {running} after {timeout:.0f} s",
                fix="a process in state D (uninterruptible I/O) stops once its I/O ends; "
                "look at it with `ps -o pid,stat,wchan -g PGID`",
            )
        time.sleep(0.005)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group has ended
        pass
