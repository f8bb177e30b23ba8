import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py helpers
sys.path.append(str(Path(__file__).parents[1]))  # the repository root: `benchmarks.*`, for tests of benchmark code
# tests/<package>/ mirror src/eaglewire/ (scripts/mirror_tests.py): test files import each other's fixtures by
# their (unique) basenames, wherever each lives
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).parent.iterdir()) if d.is_dir() and any(d.glob("test_*.py"))]
torch.set_num_threads(2)
TEST_FLUSH_BYTES = 8 << 20  # the draft calibration's cache flush in tests (_calibrations_in_tmp)


@pytest.fixture(scope="session", autouse=True)
def _calibrations_in_tmp(tmp_path_factory):
    """Runtimes the tests calibrate cache their layouts (and the markers of what they compiled) under a
    per-session temp dir, not the user's cache (which the embedded target's conversion, shared with the
    tests, keeps using). Session scope: set up before any module fixture that builds a runtime."""
    from eaglewire import fastcpu

    if fastcpu.available() is not None:  # no calibration without the extra
        yield
        return
    from eaglewire.fastcpu import calibration, gemm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration, "cache_root", tmp_path_factory.getbasetemp)
        # a draft calibration's cache flush writes twice the last-level cache (hundreds of MB on a server CPU)
        # before each of its hundreds of timed calls: most of a CLI bench test's time. Tests check what a
        # calibration records and how the runtime uses it, never which layout wins (timings are benchmarks'),
        # so they flush a small buffer; every flush still runs (tests/fastcpu/test_draft.py counts them)
        mp.setattr(gemm.CacheFlush, "__init__", lambda self: setattr(self, "buf", torch.zeros(TEST_FLUSH_BYTES // 4)))
        # so do the markers of compiled layouts (the kernels stay in inductor's cache: the tests share it)
        mp.setattr(calibration, "compiled_marker_dir", lambda: tmp_path_factory.getbasetemp() / "compiled-markers")
        yield


@pytest.fixture
def kept_calibrations(monkeypatch):
    """For a test whose subject is not the calibration (the real target's run, whose bench calibrates it): its
    runtimes' GEMM layout calibrations kept between sessions in the user cache's test-calibrations/, not the
    session's temp dir. Timing the real target's layouts (every candidate, compiled ones included) is most of
    such a test; its file's name hashes all the answer depends on (CPU, torch, threads, the target's shapes,
    the layouts), so a session reuses one only where it would time the same thing. Never the users'
    calibration/: these are timed with the tests' small cache flush (`_calibrations_in_tmp`)."""
    from eaglewire import fastcpu
    from eaglewire.cache import cache_root

    if fastcpu.available() is None:
        from eaglewire.fastcpu import calibration

        monkeypatch.setattr(calibration, "cache_root", lambda: cache_root() / "test-calibrations")


RELEASED_VLLM_K = 3  # the draft tokens a round of `released_vllm_speculator`


@pytest.fixture(scope="session")
def released_vllm_speculator(tmp_path_factory):
    """Real vLLM serving the embedded target with the released draft's vLLM export as its EAGLE-3 speculator
    (k=RELEASED_VLLM_K, fp32, one sequence at a time, compiled: the path users run), started once for the
    session. Two test files serve exactly this (tests/vllm_client/test_vllm_client.py: losslessness and vLLM's
    acceptance against ours; tests/doctor/test_live_vllm.py: `doctor live` finds it healthy), and a start costs
    minutes on a small CPU. Yields (server, the export's directory); the server is paused (SIGSTOP: no CPU)
    outside `with srv.resumed():`, and its counters are cumulative, so each test reads them before and after
    its own requests. Only modules that checked vLLM's venv is there ask for it."""
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.target.loader import load_target, resolve_target
    from eaglewire.vllm_client.server import VllmServer

    draft = load_checkpoint(resolve_draft(None), target=load_target())
    export = export_draft(draft, draft.contract, tmp_path_factory.mktemp("released-vllm") / "vllm", "vllm")
    spec = {"method": "eagle3", "model": str(export), "num_speculative_tokens": RELEASED_VLLM_K}
    with VllmServer(resolve_target(None)[1], dtype="float32", speculative_config=spec, max_num_seqs=1) as srv:
        srv.pause()
        yield srv, export


# `EAGLEWIRE_RECORD_FINDINGS=FILE pytest tests/doctor/ ...` records every doctor finding the broken
# cases of the tests really produce (with the test that built each), for the findings catalogue's examples
# (docs/gen_reference.py reads docs/doctor-examples.json; docs/gen_doctor_examples.sh rewrites it).
_RECORDED: dict[tuple[str, ...], str] = {}


def pytest_configure(config):
    import os
    import re

    if not os.environ.get("EAGLEWIRE_RECORD_FINDINGS"):
        return
    from eaglewire.doctor.findings import Finding

    init = Finding.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        text = [re.sub(r"/\S*?/pytest-of-[^/\s]+/pytest-\d+/", "", t) for t in (self.what, self.why, self.fix)]
        _RECORDED.setdefault((self.level, self.check, *text), test)  # test temp dirs named from their base

    Finding.__init__ = recording_init


def pytest_sessionfinish(session, exitstatus):
    import json
    import os

    path = os.environ.get("EAGLEWIRE_RECORD_FINDINGS")
    if not path or not _RECORDED:
        return
    rows = [dict(zip(("level", "check", "what", "why", "fix"), k), test=t) for k, t in _RECORDED.items()]
    if Path(path).is_file():  # a partial rerun adds to the file; docs/gen_doctor_examples.sh starts afresh
        seen = {tuple(r[k] for k in ("level", "check", "what", "why", "fix")) for r in rows}
        rows += [
            r
            for r in json.loads(Path(path).read_text())["findings"]
            if tuple(r[k] for k in ("level", "check", "what", "why", "fix")) not in seen
        ]
    rows.sort(key=lambda r: (r["check"], r["level"], r["what"]))
    Path(path).write_text(json.dumps({"findings": rows}, indent=1, ensure_ascii=False) + "\n")
