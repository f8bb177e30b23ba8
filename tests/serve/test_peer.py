"""The vLLM peer rows' bookkeeping (serve/peer.py), without vLLM: counters between two readings, EOS."""

import pytest

from eaglewire.serve.peer import _with_eos, acceptance_between
from eaglewire.errors import EaglewireError


def test_acceptance_counts_only_the_requests_between_two_readings():
    # warm-up: 4 drafts, 2 accepted (pos 1: 2, pos 2: 0); then 6 more drafts with 9 accepted (5, 3, 1)
    before = {"num_drafts": 4.0, "num_accepted_tokens": 2.0, "per_position": [0.5, 0.0, 0.0]}
    after = {"num_drafts": 10.0, "num_accepted_tokens": 11.0, "per_position": [0.7, 0.3, 0.1]}
    tau, per = acceptance_between(before, after, 3)
    assert tau == pytest.approx(1 + 9 / 6)
    assert per == pytest.approx([5 / 6, 3 / 6, 1 / 6])
    fresh = {"num_drafts": 0.0, "per_position": {}}  # spec_metrics before any drafts: no per-position list
    assert acceptance_between(fresh, after, 3)[1] == pytest.approx([0.7, 0.3, 0.1])
    with pytest.raises(EaglewireError, match="no speculative steps"):
        acceptance_between(after, after, 3)


def test_vllm_tokens_keep_the_eos_our_loops_keep():
    assert _with_eos([5, 6, 2, 9], eos=2, max_new=8) == [5, 6, 2]
    assert _with_eos([5, 6], eos=2, max_new=8) == [5, 6, 2]  # stopped early: at the EOS it left out
    assert _with_eos([5, 6], eos=2, max_new=2) == [5, 6]  # stopped at the length limit


def test_run_report_quotes_the_peer_rows():
    from eaglewire.pipeline.report_bench import bench_rows as _bench_rows, verdict

    def row(tok_s, **kw):
        return {"median_tok_s": tok_s, "matches_vanilla": 2, **kw}

    res = {
        "prompts": 2,
        "chain": {"num_steps": 3},
        "tree": {"num_steps": 2, "topk": 2, "num_draft_tokens": 4},
        "methods": {
            "vanilla": row(20.0),
            "eagle_chain": row(30.0, tau=2.0, per_position=[0.6, 0.3, 0.1]),
            "vllm_vanilla": row(25.0),
            "vllm_eagle_chain": row(27.5, tau=2.0, per_position=[0.6, 0.3, 0.1]),
        },
    }
    for m in res["methods"].values():
        for base in ("vanilla", "vllm_vanilla"):
            m[f"speedup_vs_{base}"] = m["median_tok_s"] / res["methods"][base]["median_tok_s"]
    text = verdict(res)
    assert "eagle_chain (k=3) at 30.00 tok/s = 1.50×" in text
    assert "vllm_eagle_chain (k=3) 27.50 tok/s (1.10× its vanilla, τ 2.00); ours is 1.09× its tok/s" in text
    head, rows = _bench_rows(res)
    assert "× vllm_vanilla" in head and rows[1][head.index("× vllm_vanilla")] == "1.20×"


def _state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]  # R, S, T (stopped), Z, ...


def test_a_paused_server_is_frozen_resumes_and_still_stops(tmp_path):
    """pause / resume / stop signal the server's whole process group; stop() works on a paused server (a
    stopped process holds SIGTERM until SIGCONT). A shell and its child stand in for vLLM's two processes."""
    import subprocess
    import time

    from eaglewire.vllm_client.server import VllmServer

    srv = VllmServer(tmp_path, log_path=tmp_path / "log")
    srv.proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    group = _wait_for_group(srv.proc.pid, 2)
    srv.pause()
    assert {_state(p) for p in group} == {"T"}  # pause() returns once the whole group is stopped
    srv.resume()
    time.sleep(0.2)
    assert "T" not in {_state(p) for p in group}
    srv.pause()
    t0 = time.perf_counter()
    srv.stop(grace=5)
    assert srv.proc.poll() is not None and time.perf_counter() - t0 < 3  # by SIGTERM, not the SIGKILL after grace
    with pytest.raises(EaglewireError, match="not running"):
        srv.pause()


def test_pause_waits_for_every_process_and_names_one_that_does_not_stop(monkeypatch):
    """pause() polls the group's threads until none runs; a thread still running after the timeout is an
    error naming it (SIGSTOP cannot be ignored, so this stands in a thread stuck in state D)."""
    from eaglewire.vllm_client import process as vllm

    seen = iter([{10: "R", 11: "T"}, {10: "T", 11: "T"}])
    monkeypatch.setattr(vllm, "_group_states", lambda pgid: next(seen))
    vllm._wait_group_stopped(10, timeout=5)  # returns on the second look, raising nothing
    with pytest.raises(StopIteration):  # and it did look twice
        next(seen)
    monkeypatch.setattr(vllm, "_group_states", lambda pgid: {10: "D", 11: "T", 12: "Z"})
    with pytest.raises(EaglewireError, match=r"\{10: 'D'\}"):
        vllm._wait_group_stopped(10, timeout=0.05)


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[2]) == pgid
    except (OSError, ValueError):
        return False


def _group(pgid: int) -> list[int]:
    import os

    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), pgid)]


def _wait_for_group(pgid: int, size: int, timeout: float = 5.0) -> list[int]:
    import time

    deadline = time.monotonic() + timeout
    while len(group := _group(pgid)) != size and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group) == size, group
    return group


CHILD = """
import sys, time
from pathlib import Path
from eaglewire.vllm_client.server import VllmServer

class Fake(VllmServer):  # vLLM's two processes stood in for by a shell and its child
    def command(self):
        return ["sh", "-c", "sleep 120 & wait"]

    def _wait_ready(self):
        pass

srv = Fake(sys.argv[1], log_path=Path(sys.argv[1]) / "log")
srv.start()
time.sleep(1)  # let the shell start its child before the group is frozen
srv.pause()
print(srv.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_paused_server_whose_parent_dies_is_ended_by_its_watchdog(tmp_path):
    """A process that dies without stopping its servers (SIGKILL, OOM) leaves them paused: the parent-death
    SIGTERM stays pending on a stopped process. The watchdog sees its pipe close and kills the group."""
    import os
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pgid = int(child.stdout.readline())
    try:
        group = _wait_for_group(pgid, 2)
        assert {_state(p) for p in group} == {"T"}, [(p, _state(p)) for p in group]
        child.send_signal(signal.SIGKILL)
        child.wait()
        _wait_for_group(pgid, 0, timeout=10)  # fails (the paused shell and sleep live on) without the watchdog
    finally:  # leave nothing behind when it fails
        child.kill()
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
