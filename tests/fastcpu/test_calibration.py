"""GEMM layout calibration persisted across processes: measured once per machine/torch/threads/target
shape+dtype/candidate set and reused by the next start without a single timing forward; a changed key
measures again; an unusable file is measured again and rewritten, with a message saying so."""

import json

import pytest
import torch
from tiny import build_target
from typer.testing import CliRunner

from eaglewire.fastcpu import calibration as C
from eaglewire.fastcpu.compiled_body import GRAPH, INDUCTOR_LAYOUTS
from eaglewire.fastcpu.gemm import COMPILED, applies
from eaglewire.fastcpu.start import make_fast_runtime as make_runtime
from eaglewire.compose import proposer as make_proposer
from eaglewire.fastcpu.runtime import CALIBRATION_PREFIX, FastRuntime
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

KS = (1, 2, 4)  # a short calibration: these tests are about the cache, not the timings
ROOM = CALIBRATION_PREFIX + max(KS)  # the slots a calibration writes


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh user cache, found by the real rule (conftest points calibrations at a session temp dir)."""
    from eaglewire import cache as user_cache

    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "cache_root", user_cache.cache_root)
    return tmp_path


@pytest.fixture
def forwards(monkeypatch):
    """Counts FastRuntime forwards and greedy-head calls (calibration is nothing but timed calls of both)."""
    calls = []
    for name in ("forward", "argmax"):
        real = getattr(FastRuntime, name)

        def counted(self, *a, _real=real, **k):
            calls.append(1)
            return _real(self, *a, **k)

        monkeypatch.setattr(FastRuntime, name, counted)
    return calls


@pytest.fixture
def short_calibration(monkeypatch):
    """make_fast_runtime's starts calibrate KS once, unrefined (which start measures and which reuses is the
    point of the tests using it, not the timings): the measuring start and the reusing one agree on it, as
    they do on the defaults."""
    from functools import partial

    from eaglewire.fastcpu import start

    monkeypatch.setattr(start, "calibrate_cached", partial(C.calibrate_cached, ks=KS, reps=1, refine=0))
    for name, value in (("CALIBRATION_KS", KS), ("CALIBRATION_REPS", 1), ("REFINE_REPS", 0)):
        monkeypatch.setattr(C, name, value)


def _start(target, log):
    rt = FastRuntime(target, max_len=ROOM)
    policy, path, reused = C.calibrate_cached(rt, log.append, ks=KS, reps=1, refine=0)
    assert rt.policy == policy
    return policy, path, reused


def test_second_start_reuses_the_cache_without_timing(cache, forwards):
    target, log = build_target("llama"), []
    policy, path, reused = _start(target, log)
    key = C.calibration_key(FastRuntime(target, 8), KS, 1, 0)
    timed = sum(applies(lay, k) for lay in key["layouts"] for k in KS)  # the compiled GEMV: one row only
    # reps=1: each (layout or head, rows) runs once untimed (a warm-up) and once timed
    assert not reused and len(forwards) == 2 * (timed + len(KS) * len(key["heads"]))
    assert path.parent == cache / "calibration" and "calibrating GEMM layouts" in log[0] and str(path) in log[0]
    record = json.loads(path.read_text())
    assert record["key"]["target"]["dtype"] == "float32" and set(record["median_ms"]) == {"1", "2", "4"}
    assert set(record["head_policy"]) == set(record["head_median_ms"]) == {"1", "2", "4"}
    assert set(record["head_policy"].values()) <= set(record["key"]["heads"])
    forwards.clear()
    again, path2, reused = _start(target, log)
    assert reused and again == policy and path2 == path and forwards == []
    rt = FastRuntime(target, max_len=ROOM)
    C.calibrate_cached(rt, log.append, ks=KS, reps=1, refine=0)
    assert {str(k): v for k, v in rt.head_policy.items()} == record["head_policy"]  # the greedy head too
    assert log[-1].startswith(f"reusing GEMM layout calibration from {path}")


def test_a_changed_key_measures_again(cache, forwards, monkeypatch):
    target, log = build_target("llama"), []
    _, path, _ = _start(target, log)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads != 1 else 2)
    try:
        forwards.clear()
        _, other, reused = _start(target, log)
    finally:
        torch.set_num_threads(threads)
    assert not reused and other != path and forwards
    forwards.clear()
    _, deeper, reused = _start(build_target("llama", layers=2), log)  # another target shape
    assert not reused and deeper not in (path, other) and forwards
    forwards.clear()
    with monkeypatch.context() as m:  # the screen's cost changed: time it again
        m.setattr(C, "SCREEN_REVISION", C.SCREEN_REVISION + 1)
        _, revised, reused = _start(target, log)
    assert not reused and revised not in (path, other, deeper) and forwards
    target.model.to(torch.bfloat16)  # another dtype (also another candidate set where bf16 is not native)
    _, low, reused = _start(target, log)
    assert not reused and low not in (path, other, deeper)


@pytest.mark.parametrize(
    "content",
    ["{not json", "", json.dumps({"key": "someone else's", "policy": {}}), "POLICY", "HEAD", "ONE-ROW"],
    ids=["truncated", "empty", "wrong-key", "bad-policy", "bad-head", "one-row-layout-on-2"],
)
def test_an_unusable_file_is_measured_again_with_a_message(cache, forwards, content):
    target, log = build_target("llama"), []
    policy, path, _ = _start(target, log)
    if content == "POLICY":  # the right key, a layout that is no candidate
        record = json.loads(path.read_text())
        record["policy"]["1"] = "fortran"
        content = json.dumps(record)
    if content == "ONE-ROW":  # a candidate layout, on a row count it does not apply to
        record = json.loads(path.read_text())
        record["policy"]["2"] = COMPILED
        content = json.dumps(record)
    if content == "HEAD":  # the right key and layouts, a greedy head that is no candidate
        record = json.loads(path.read_text())
        record["head_policy"]["2"] = "approximate"
        content = json.dumps(record)
    path.write_text(content)
    forwards.clear()
    again, path2, reused = _start(target, log)
    assert not reused and path2 == path and forwards
    assert log[-3].startswith(f"calibration cache {path} is unusable (") and "calibrating again" in log[-3]
    assert json.loads(path.read_text())["policy"] == {str(k): v for k, v in again.items()}  # rewritten, valid


def test_make_runtime_calibrates_through_the_cache(cache, forwards):
    target, log = build_target("llama"), []
    make_runtime(target, 32, calibrate=True, log=log.append)
    forwards.clear()
    rt = make_runtime(target, 32, calibrate=True, log=log.append)
    reused = [m for m in log if m.startswith("reusing GEMM layout calibration from")]
    # nothing timed again: at most one warm-up forward per compiled row class (GRAPH: one row, several;
    # the compiled GEMV: one row), announced
    compiled = any(rt.layout(k) in INDUCTOR_LAYOUTS for k in rt.policy)
    assert len(reused) == 1 and len(forwards) == (len(rt.compile_graphs()) if compiled else 0)
    said = [m for m in log if not m.startswith("freed ")]  # what the start freed, if anything: not its point here
    assert compiled == said[-1].startswith("compiled layouts for ")
    assert set(rt.policy) == {1, 2, 3, 4, 8, 16, 32}
    log.clear()
    make_runtime(build_target("deepseek_v3"), 32, calibrate=True, log=log.append)
    assert "no GEMM layouts to calibrate" in log[0]


def test_cached_compile_waits_for_no_compiler_until_a_start_built_the_layouts(cache, tmp_path, monkeypatch):
    """compile="cached" (generate's default): no inductor layout, not even its probe, until a start with
    compile="always" (serve, bench) has built them for this target and cache size; then they are offered.
    A marker is per cache size: another size is eager again."""
    from tiny import build_draft

    from eaglewire.fastcpu import compiled_gemv
    from eaglewire.decoding.tree import TreeShape

    monkeypatch.setattr(C, "compiled_marker_dir", lambda: tmp_path / "markers")
    target, log = build_target("llama"), []
    real_available = compiled_gemv.available

    def forbidden(dtype):  # bf16 needs no probe (the GEMV is fp32 only): any call is fine that far
        if dtype == torch.float32:
            raise AssertionError("the inductor probe ran in a start that must not compile")
        return False

    with monkeypatch.context() as m:
        m.setattr(compiled_gemv, "available", forbidden)
        rt = make_runtime(target, 32, calibrate=True, log=log.append, compile="cached")
        assert not set(rt.candidates) & {GRAPH, COMPILED} and rt.graph is None
        assert "eager layouts this time" in log[0] and not (tmp_path / "markers").exists()
        never = make_runtime(target, 32, calibrate=True, compile="never")
        assert not set(never.candidates) & {GRAPH, COMPILED}
        plain = make_runtime(target, 32)  # uncalibrated (the doctor's): its AUTO policy never compiles
        assert not set(plain.candidates) & {GRAPH, COMPILED} and not plain.compiled and not rt.compiled
        draft, contract = build_draft(target, taps=(1, 2, 3))
        proposer = make_proposer(draft, TreeShape.chain(2), 32, rt, contract=contract)
        assert COMPILED not in proposer.lean.candidates  # the draft beside it compiles nothing either
    built = make_runtime(target, 32, calibrate=True, compile="always")
    marker = C.compiled_marker(target, built.max_len)
    if not any(built.layout(k) in INDUCTOR_LAYOUTS for k in built.policy):  # nothing built, nothing promised
        assert built.compiled and not marker.exists()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("{}")  # as a start that compiled something would leave it, to test the reading side
    assert marker.is_file() and marker.parent == tmp_path / "markers"
    cached = make_runtime(target, 32, calibrate=True, compile="cached")
    assert cached.compiled and set(built.candidates) == set(cached.candidates)
    if real_available(torch.float32):  # where inductor works here, the cached start now offers its layouts
        assert COMPILED in cached.candidates
    log.clear()
    other = make_runtime(target, 600, calibrate=True, log=log.append, compile="cached")  # another cache size
    assert not set(other.candidates) & {GRAPH, COMPILED} and "eager layouts this time" in log[0]
    with pytest.raises(ValueError, match="compile must be one of"):
        make_runtime(target, 32, compile="sometimes")


def test_generate_says_what_its_start_does_and_times_nothing_before_its_first_token_unless_asked(
    cache, tmp_path, monkeypatch, short_calibration
):
    from test_server import _tiny_target_dir

    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.cli.app import app
    from eaglewire.target.loader import load_target
    from tiny import build_draft

    tdir = _tiny_target_dir(tmp_path)
    draft, contract = build_draft(load_target(str(tdir)), taps=(1, 2, 3))
    save_checkpoint(draft, contract, tmp_path / "draft")
    args = ["generate", "--target", str(tdir), "--draft", str(tmp_path / "draft"), "-p", "Hi.", "--max-new-tokens", "4"]
    from eaglewire.fastcpu.draft import FastDraft

    timed = []  # the target's calibrations, then the draft's (its layouts are timed beside the target's only)
    for cls in (FastRuntime, FastDraft):
        monkeypatch.setattr(
            cls,
            "calibrate",
            lambda self, *a, _real=cls.calibrate, _c=cls, **k: timed.append(_c.__name__) or _real(self, *a, **k),
        )
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output + repr(first.exception)
    assert "loading target" in first.stderr and "loading draft" in first.stderr
    assert not timed and "no GEMM layout calibration for this machine yet" in first.stderr
    assert "--calibrate always" in first.stderr and not (cache / "calibration").exists()
    asked = CliRunner().invoke(app, args + ["--calibrate", "always"])
    assert asked.exit_code == 0, asked.output + repr(asked.exception)
    assert (
        timed == ["FastRuntime", "FastDraft"]
        and "calibrating GEMM layouts" in asked.stderr
        and str(cache / "calibration") in asked.stderr
    )
    timed.clear()
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0 and "reusing GEMM layout calibration from" in second.stderr
    assert timed == ["FastDraft"]  # the draft's layouts are measured per start, beside a calibrated target
    bad = CliRunner().invoke(app, args + ["--calibrate", "sometimes"])
    assert bad.exit_code == 2 and "--calibrate" in bad.output


def test_a_cached_calibration_start_reuses_or_keeps_the_defaults_and_never_times(cache, forwards, short_calibration):
    target, log = build_target("llama"), []
    cold = make_runtime(target, 32, calibrate="cached", log=log.append, compile="never")
    assert not forwards and cold.policy == FastRuntime(target, 8).policy  # the uncalibrated defaults
    assert "no GEMM layout calibration for this machine yet" in log[-1]
    measured = make_runtime(target, 32, calibrate="always", compile="never")
    forwards.clear()
    log.clear()
    warm = make_runtime(target, 32, calibrate="cached", log=log.append, compile="never")
    assert not forwards and warm.policy == measured.policy and warm.head_policy == measured.head_policy
    assert log[0].startswith("reusing GEMM layout calibration from")
    with pytest.raises(ValueError, match="calibrate must be"):
        make_runtime(target, 32, calibrate="sometimes")


def test_make_runtime_builds_the_fused_graph_of_the_verify_size_it_is_told_and_says_so(cache, monkeypatch):
    """verify_rows under compile="always": compile_graphs times the asked size's fused graph against the
    shared one and the log names both figures and the choice; a "cached" start builds none."""
    from eaglewire.fastcpu import panel_gemm, runtime
    from eaglewire.fastcpu.compiled_body import FUSED, FUSED_ROWS, GRAPH, target_layouts

    if GRAPH not in target_layouts(torch.float32):
        pytest.skip("no inductor graph offered here (fastcpu/compiled_body.py)")

    def fake_time(candidates, ks, reps, run, **_):  # the graph wins every row count, the fused graph its own
        win = FUSED if FUSED in candidates else GRAPH if GRAPH in candidates else candidates[0]
        for k in ks:
            for lay in candidates:
                if applies(lay, k):
                    run(lay, k)
        return {k: win for k in ks}, {k: {lay: 1.0 if lay == win else 2.0 for lay in candidates} for k in ks}

    monkeypatch.setattr(runtime, "time_layouts", fake_time)
    monkeypatch.setattr(panel_gemm, "available", lambda kernel, dtype: False)  # a host without the panel GEMMs
    target, log = build_target("llama"), []
    rt = make_runtime(target, 32, calibrate=True, log=log.append, verify_rows=(3, max(FUSED_ROWS) + 1))
    assert rt.graph.fused == {3} and rt.fused_ms == {3: {GRAPH: 2.0, FUSED: 1.0}}
    said = [m for m in log if not m.startswith("freed ")]  # what the start freed, if anything: not its point here
    assert "and the fused graphs of 3-row verifies" in said[-2] and said[-2].startswith(
        "compiled layouts for 1 and 2+ rows"
    )
    assert said[-1] == "3-row verify: its fused graph 1.0 ms against the shared graph's 2.0 ms (kept)"
    log.clear()
    rt = make_runtime(target, 32, calibrate=True, log=log.append, verify_rows=(3,), compile="cached")
    assert rt.graph.fused == set() and rt.fused_ms == {}


def test_the_key_names_the_panel_kernels_build(monkeypatch, tmp_path):
    """A changed panel kernel (its source, compiler or torch: the build directory's digest) is timed anew
    rather than trusted to a calibration of the old one."""
    from eaglewire.fastcpu import panel_gemm
    from eaglewire.fastcpu.gemm import PANEL

    rt = FastRuntime(build_target("llama"), 8)
    if PANEL not in rt.candidates:
        pytest.skip("the panel GEMM is not offered here (fastcpu/panel_gemm.missing() says why)")
    key = C.calibration_key(rt, KS, 1, 0)
    assert key["panel_gemm"][PANEL] == panel_gemm.build_dir(panel_gemm.AVX2).name
    changed = tmp_path / "panel_gemm.cpp"
    changed.write_text(panel_gemm.SOURCE.read_text() + "// another kernel\n")
    monkeypatch.setattr(panel_gemm, "SOURCE", changed)
    assert C.calibration_key(rt, KS, 1, 0)["panel_gemm"] != key["panel_gemm"]


def test_the_graphs_gemm_is_stored_and_restored(cache, monkeypatch):
    """The calibration file keeps the graph's multi-row GEMM; a later start restores it without timing,
    and a file naming a GEMM not offered here is measured again."""
    from eaglewire.fastcpu import runtime
    from eaglewire.fastcpu.compiled_body import GRAPH_GEMMS
    from eaglewire.fastcpu.gemm import PACKED, PANEL

    target, log = build_target("llama"), []
    rt = FastRuntime(target, max_len=ROOM)
    if rt.graph is None or PANEL not in rt.candidates:
        pytest.skip("the graph or the panel GEMM is not offered here")
    real = runtime.time_layouts

    def dnnl_wins_the_gemms(cands, ks, reps, run, **kw):
        if set(cands) <= set(GRAPH_GEMMS):  # the graph's GEMMs: the panel kernel(s) offered here and oneDNN's
            return {}, {k: {lay: 1.0 if lay == PACKED else 2.0 for lay in cands} for k in ks}
        return real(cands, ks, reps, run, **kw)

    monkeypatch.setattr(runtime, "time_layouts", dnnl_wins_the_gemms)
    _, path, reused = C.calibrate_cached(rt, log.append, ks=KS, reps=1, refine=0)
    assert not reused and rt.graph_gemm == PACKED and "the graph's multi-row GEMM dnnl" in log[-1]
    assert json.loads(path.read_text())["graph_gemm"] == PACKED
    again = FastRuntime(target, max_len=ROOM)
    assert again.graph_gemm == PANEL  # the default before a calibration
    _, _, reused = C.calibrate_cached(again, log.append, ks=KS, reps=1, refine=0)
    assert reused and again.graph_gemm == PACKED and again.graph.gemm == PACKED
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "graph_gemm": "tn"}))
    C.calibrate_cached(FastRuntime(target, max_len=ROOM), log.append, ks=KS, reps=1, refine=0)
    assert any("graph_gemm 'tn' is not one of" in line for line in log)
