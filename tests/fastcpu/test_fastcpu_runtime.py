"""The accelerated runtime, fastcpu.runtime.FastRuntime (q/k/v and gate/up fused into one GEMM each) equals HF transformers' unfused forward
within 1e-4 (fp32) on every supported architecture and every GEMM layout."""

import pytest
import torch
from tiny import VOCAB, assert_matches_hf, build_target

from eaglewire.fastcpu.compiled_body import GRAPH, target_layouts
from eaglewire.fastcpu.gemm import COMPILED, LAYOUTS, PACKED, PANEL, PANEL_AVX512, PANELS, candidate_layouts
from eaglewire.fastcpu.runtime import CALIBRATION_PREFIX, FastRuntime
from eaglewire.capture.hooks import capture
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

NO_GRAPH = "no C++ toolchain for inductor or no oneDNN prepacked linear here (fastcpu/compiled_body.py)"


def graph_offered() -> bool:
    return GRAPH in target_layouts(torch.float32)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("layout", ["auto", *LAYOUTS, PACKED, PANEL, PANEL_AVX512, COMPILED, GRAPH])
def test_prefill_decode_and_taps_match_hf(arch, layout):
    if layout == PACKED and PACKED not in candidate_layouts(torch.float32):
        pytest.skip("this torch build exposes no oneDNN prepacked linear (torch.ops.mkldnn._linear_pointwise)")
    if layout in PANELS and layout not in candidate_layouts(torch.float32):
        pytest.skip(f"the {layout} GEMM is not offered here (fastcpu/panel_gemm.missing() says why)")
    if layout == COMPILED and COMPILED not in candidate_layouts(torch.float32):
        pytest.skip("no C++ compiler for inductor here (fastcpu/compiled_gemv.py)")
    if layout == GRAPH and not graph_offered():
        pytest.skip(NO_GRAPH)
    target = build_target(arch)
    assert_matches_hf(target, FastRuntime(target, max_len=32, layout=layout))


@pytest.mark.parametrize("layout", ["auto", GRAPH])
def test_tree_mask_and_commit(layout):
    if layout == GRAPH and not graph_offered():
        pytest.skip(NO_GRAPH)
    target = build_target("llama")
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    lean = FastRuntime(target, max_len=32, layout=layout)
    lean.forward(ids[:, :5], torch.arange(5)[None], 0)
    # a tree of two branches at depth 1..2: slots 5,6 = branch a (x5, x6), slots 7,8 = branch b (y5, y6)
    a = ids[:, 5:7]
    b = torch.tensor([[3, 4]])
    tree_ids = torch.cat([a, b], dim=1)
    positions = torch.tensor([[5, 6, 5, 6]])
    mask = torch.zeros(1, 1, 4, 9, dtype=torch.bool)
    mask[..., :5] = True
    for q, visible in enumerate([[5], [5, 6], [7], [7, 8]]):
        mask[0, 0, q, visible] = True
    logits, _ = lean.forward(tree_ids, positions, 5, mask)
    with torch.no_grad():
        ref_b = target.model(input_ids=torch.cat([ids[:, :5], b], 1)).logits
        ref_a = target.model(input_ids=ids[:, :7]).logits
    torch.testing.assert_close(logits[:, 2:], ref_b[:, 5:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[:, :2], ref_a[:, 5:], atol=1e-4, rtol=1e-4)
    # accept branch b: move slots 7,8 to 5,6, then decode the next token as if b had been a plain chain
    lean.commit(torch.tensor([7, 8]), 5)
    nxt, _ = lean.forward(torch.tensor([[9]]), torch.tensor([[7]]), 7)
    with torch.no_grad():
        ref = target.model(input_ids=torch.cat([ids[:, :5], b, torch.tensor([[9]])], 1)).logits
    torch.testing.assert_close(nxt[:, 0], ref[:, -1], atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_refused():
    with pytest.raises(Exception, match="does not support model_type 'deepseek_v3'"):
        FastRuntime(build_target("deepseek_v3"), max_len=8)


def test_calibrate_picks_a_layout_per_row_count_and_keeps_results():
    target = build_target("llama")
    lean = FastRuntime(target, max_len=CALIBRATION_PREFIX + 4)  # the slots the calibration writes
    policy = lean.calibrate(ks=(1, 4), reps=1)
    # 2 is timed too where the one-row GEMV is a candidate: it may win 1 row and must not get 2-3
    expected = {1, 2, 4} if COMPILED in candidate_layouts(torch.float32) else {1, 4}
    assert set(policy) == expected and set(policy.values()) <= set(lean.candidates)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits
    logits, _ = lean.forward(ids, torch.arange(6)[None], 0)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    for start, rows in ((0, 1), (1, 2), (3, 3)):  # every row count a round can verify, through pick()
        logits, _ = lean.forward(ids[:, start : start + rows], torch.arange(start, start + rows)[None], start)
        torch.testing.assert_close(logits, ref[:, start : start + rows], atol=1e-4, rtol=1e-4)


def test_fused_projections_are_one_gemm_each():
    """q/k/v share one weight [(heads + 2 kv_heads) * head_dim, H] and gate/up one [2 I, H]; Qwen2's q/k/v
    biases are fused alongside."""
    target = build_target("qwen2")
    lean = FastRuntime(target, max_len=8)
    cfg, a = target.text_config, target.layers[0].self_attn
    hd = cfg.hidden_size // cfg.num_attention_heads
    L = lean.layers[0]
    assert L.qkv.w.shape == ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd, cfg.hidden_size)
    assert L.gate_up.w.shape == (2 * cfg.intermediate_size, cfg.hidden_size)
    torch.testing.assert_close(L.qkv.b, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach())


def test_unavailable_layout_refused(monkeypatch):
    from eaglewire import hw

    monkeypatch.setattr(hw, "native_bf16", lambda: False)
    target = build_target("llama")
    target.model.to(torch.bfloat16)
    assert PACKED not in candidate_layouts(torch.bfloat16)  # oneDNN bf16 on a CPU that emulates it: not offered
    with pytest.raises(Exception, match="GEMM layout 'dnnl' is not available here"):
        FastRuntime(target, max_len=8, layout=PACKED)


def test_the_compiled_gemv_is_one_row_only_and_policies_never_give_it_more():
    from eaglewire.fastcpu.gemm import Gemm, applies, fixed_policy, pick, row_counts

    assert fixed_policy(COMPILED) == {1: COMPILED, 2: "nt"} and fixed_policy(PACKED) == {1: PACKED}
    # a calibration of rows (1, 4) times 2 as well where the one-row layout may win 1 row
    assert row_counts((1, 4), ("nt", COMPILED)) == (1, 2, 4) and row_counts((1, 4), ("nt", PACKED)) == (1, 4)
    assert row_counts((1, 2, 8), ("nt", COMPILED)) == (1, 2, 8) and row_counts((4, 8), ("nt", COMPILED)) == (4, 8)
    assert applies(COMPILED, 1) and not applies(COMPILED, 2) and applies(PACKED, 7)
    with pytest.raises(ValueError, match="does not apply"):
        pick({1: COMPILED}, 3)
    if COMPILED not in candidate_layouts(torch.float32):
        pytest.skip("no C++ compiler for inductor here (fastcpu/compiled_gemv.py)")
    g = torch.Generator().manual_seed(0)
    lin = Gemm(torch.randn(40, 24, generator=g), torch.randn(40, generator=g))
    x = torch.randn(1, 1, 24, generator=g)
    torch.testing.assert_close(lin(x, COMPILED), x @ lin.w.t() + lin.b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one-row GEMV; got 2 rows"):
        lin(torch.randn(1, 2, 24), COMPILED)


def test_the_compiled_gemv_is_not_offered_where_inductor_cannot_build_its_probe(monkeypatch, capsys):
    """A compiler on PATH is not enough (inductor also needs Python's and OpenMP's headers): a probe kernel
    that fails to build takes the layout out of the candidates, with a line saying why."""
    from eaglewire.fastcpu import compiled_gemv

    def broken(shape, dtype):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setattr(compiled_gemv, "compiler", lambda: "g++")
    monkeypatch.setattr(compiled_gemv, "kernel", broken)
    compiled_gemv.available.cache_clear()
    try:
        assert COMPILED not in candidate_layouts(torch.float32)
        err = capsys.readouterr().err
        assert "not offered here" in err and "InvalidCxxCompiler" in err
    finally:
        compiled_gemv.available.cache_clear()
    assert not compiled_gemv.available(torch.bfloat16)


def test_the_compiled_gemv_is_not_offered_where_its_probe_computes_a_wrong_product(monkeypatch, capsys):
    """A kernel that builds but computes the wrong product (seen: inductor under ATEN_CPU_CAPABILITY=avx2 on
    an AVX-512 machine, its cache holding the uncapped kernels) is no candidate either, and a line says so."""
    from eaglewire.fastcpu import compiled_gemv

    monkeypatch.setattr(compiled_gemv, "compiler", lambda: "g++")
    monkeypatch.setattr(compiled_gemv, "kernel", lambda shape, dtype: lambda w, x: (x @ w.t()) * 1.5)
    compiled_gemv.available.cache_clear()
    try:
        assert COMPILED not in candidate_layouts(torch.float32)
        err = capsys.readouterr().err
        assert "not offered here" in err and "wrong product" in err
        monkeypatch.setattr(compiled_gemv, "kernel", lambda shape, dtype: lambda w, x: x @ w.t())
        compiled_gemv.available.cache_clear()
        assert compiled_gemv.available(torch.float32)  # a right product is offered
    finally:
        compiled_gemv.available.cache_clear()


def test_the_graph_compiles_once_for_one_row_and_once_for_more_whatever_the_cache_length():
    """GRAPH's cache length and its row count above one are dynamic from the first call: a generation's
    growing cache and varying verify sizes must not recompile the whole target (about 30 s each on
    SmolLM2) nor push dynamo past its recompile limit, and nor must asking for taps or not (the warm-up at
    start-up asks for none). Logits and taps stay HF's at every length."""
    if not graph_offered():
        pytest.skip(NO_GRAPH)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    target = build_target("llama")
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits
    lean = FastRuntime(target, max_len=20, layout=GRAPH)  # the last verify reaches max_len
    n = 0
    taps = capture(target, (0, 2, 4), ids).taps  # [1, 20, 3 H]
    # prefill (eager), then steps and verifies of varying sizes, with taps and without (a vanilla step)
    for i, rows in enumerate((5, 1, 3, 1, 2, 1, 4, 1, 2)):
        want = (0, 2, 4) if i % 3 else ()
        logits, tapped = lean.forward(ids[:, n : n + rows], torch.arange(n, n + rows)[None], n, taps=want)
        torch.testing.assert_close(logits, ref[:, n : n + rows], atol=1e-4, rtol=1e-4)
        if want:
            torch.testing.assert_close(tapped, taps[:, n : n + rows], atol=1e-4, rtol=1e-4)
        else:
            assert tapped is None
        n += rows
    assert len(_debug_get_cache_entry_list(lean.graph.code)) == 2


def test_the_graph_keeps_the_guards_on_its_arguments_and_drops_those_on_the_runtime():
    """The graph's guard filter: a guard on the runtime's attributes (each weight, cache view, constant)
    goes, since they are set once; a guard on a call's tensor (its row count, its cache length), on the
    shape environment or on a global stays, or a 4-row verify could run the 1-row graph."""
    from types import SimpleNamespace

    from eaglewire.fastcpu.compiled_body import _keep_guard

    names = ["rt.layers[0].qkv.w", "rt.k_layers[3]", "rt.eps", "h", "mask", "", "G['torch']", "rt"]
    kept = _keep_guard([SimpleNamespace(name=n) for n in names])
    assert kept == [False, False, False, True, True, True, True, True]


def test_the_graphs_packed_linear_runs_no_python_frame_of_ours_and_matches_the_product():
    """eaglewire::packed_linear's kernel is oneDNN's C builtin itself: a Python function of ours there
    (one frame per GEMM, 120 a step) mapped and unmapped a 16 KB frame-stack chunk per call at some caller
    depths (compiled_body.py has the figures). Its product is still x @ W.T + b."""
    import sys
    from pathlib import Path

    import eaglewire.fastcpu.compiled_body as body  # registers the op

    w, b, x = torch.randn(24, 16), torch.randn(24), torch.randn(1, 3, 16)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    frames: list[str] = []
    sys.setprofile(lambda frame, event, _arg: frames.append(frame.f_code.co_filename) if event == "call" else None)
    try:
        y = torch.ops.eaglewire.packed_linear(x, packed, b)
    finally:
        sys.setprofile(None)
    ours = str(Path(body.__file__).parents[1])  # the eaglewire package
    assert not [f for f in frames if f.startswith(ours)], frames
    torch.testing.assert_close(y, x @ w.t() + b, atol=1e-5, rtol=1e-5)


def test_the_graph_enters_no_python_function_once_per_gemm():
    """The graph's C++ wrapper (compiled_body.GRAPH_OPTIONS) runs its GEMMs without a Python frame each.
    With the Python wrapper every GEMM entered torch's `OpOverload.__call__`, and at the caller depths where
    that frame straddled the end of CPython's 16 KB frame-stack chunk every GEMM mapped and unmapped a chunk
    (a page fault per GEMM and +28% on a 2-row step at one caller depth in about a hundred; compiled_body.py
    has the figures). Checked by the cause rather than by scanning depths for the faults: in one multi-row
    step no Python function is entered as often as there are GEMMs (the Python wrapper: OpOverload.__call__
    once per GEMM; the C++ wrapper: at most 7 calls of any function here, whatever the layer count)."""
    import sys
    from collections import Counter

    if not graph_offered():
        pytest.skip(NO_GRAPH)
    layers = 8
    lean = FastRuntime(build_target("llama", layers=layers), max_len=32, layout=GRAPH)
    gemms = 4 * layers  # q/k/v, o, gate/up, down
    h = lean.embed[torch.zeros(1, 2, dtype=torch.long)]  # a 2-row step after 8 cached slots
    cos, sin = lean.rotary(lean.embed[:1][None], torch.arange(8, 10)[None])
    cos, sin, mask = cos[:, None], sin[:, None], torch.zeros(1, 1, 2, 10)
    calls: Counter = Counter()
    with torch.no_grad():
        lean.graph(h, cos, sin, 8, mask, ())  # compiles
        sys.setprofile(lambda frame, event, _arg: calls.update([frame.f_code.co_qualname]) if event == "call" else None)
        try:
            lean.graph(h, cos, sin, 8, mask, ())
        finally:
            sys.setprofile(None)
    name, most = calls.most_common(1)[0]
    assert most < gemms, f"{name} entered {most} times in one step of {gemms} GEMMs"


@pytest.mark.parametrize("B,mask_batch", [(1, 1), (2, 1), (2, 2)])
def test_the_unfused_attention_is_sdpas_under_grouped_heads_and_a_tree_mask(B, mask_batch):
    """What the graph runs for several rows (ops.unfused_attention) against torch's fused kernel: grouped
    query heads (3 per key/value head, adjacent), an additive tree mask with blocked cache slots, a mask
    shared by the batch or one per row."""
    from eaglewire.ops import sdpa, unfused_attention

    g = torch.Generator().manual_seed(5)
    T, S, D = 4, 11, 16
    q = torch.randn(B, 6, T, D, generator=g)
    keys, values = torch.randn(B, 2, S, D, generator=g), torch.randn(B, 2, S, D, generator=g)
    allowed = torch.rand(mask_batch, 1, T, S, generator=g) > 0.4
    allowed[..., 0] = True  # every row sees the first slot (a row seeing nothing is NaN either way)
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    torch.testing.assert_close(
        unfused_attention(q, keys, values, mask), sdpa(q, keys, values, mask), atol=1e-5, rtol=1e-5
    )


def test_a_close_runner_up_is_timed_again_and_a_distant_one_is_not(monkeypatch):
    """gemm.time_layouts on a scripted clock: the first repetitions favour "b" by a hair (a noisy phase),
    the refinement's favour "a", and their pooled median picks "a"; "c", far behind, is never refined."""
    from eaglewire.fastcpu import gemm

    clock = [0.0]
    monkeypatch.setattr(gemm.time, "perf_counter", lambda: clock[0])
    calls: list[str] = []
    first = 5  # repetitions before the refinement

    def run(layout: str, k: int) -> None:
        calls.append(layout)
        n = calls.count(layout) - 1  # 0: the untimed warm-up
        noisy = n <= first
        clock[0] += {"a": 1.05 if noisy else 0.9, "b": 1.0, "c": 2.0}[layout]

    best, medians = gemm.time_layouts(("a", "b", "c"), (4,), first, run)
    assert best == {4: "a"}
    assert calls.count("c") == 1 + first  # warm-up and the first repetitions only
    assert calls.count("a") == calls.count("b") == 1 + first + gemm.REFINE_REPS
    assert medians[4]["c"] == pytest.approx(2000.0)


def test_a_fused_verify_graph_matches_hf_and_compiles_once_per_row_count():
    """FUSED: a static graph of fused multi-row GEMVs per chosen verify size, beside the shared graphs;
    logits stay HF's through all three, and other row counts keep the shared graph."""
    if not graph_offered():
        pytest.skip(NO_GRAPH)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    target = build_target("llama")
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits
    lean = FastRuntime(target, max_len=24, layout=GRAPH)
    lean.graph.fused = {2, 4}
    n = 0
    for rows in (6, 2, 1, 4, 3, 2, 4, 1, 1):  # prefill (eager), then fused 2 and 4, shared 1 and 3
        logits, _ = lean.forward(ids[:, n : n + rows], torch.arange(n, n + rows)[None], n)
        torch.testing.assert_close(logits, ref[:, n : n + rows], atol=1e-4, rtol=1e-4)
        n += rows
    assert len(_debug_get_cache_entry_list(lean.graph.fused_code)) == 2  # one static graph per fused size
    assert len(_debug_get_cache_entry_list(lean.graph.code)) == 2  # 1 row, and 3 rows (the shared graph)


@pytest.mark.parametrize("winner", ["graph", "graph-fused"])
def test_compile_graphs_keeps_the_fused_graph_only_where_it_times_faster(monkeypatch, winner):
    """compile_graphs(verify_rows) times the fused graph of each asked size in FUSED_ROWS against the
    shared one and keeps the winner; sizes outside FUSED_ROWS, or that the policy gives no GRAPH, are
    left alone (nothing compiles for them)."""
    if not graph_offered():
        pytest.skip(NO_GRAPH)
    from eaglewire.fastcpu import panel_gemm, runtime
    from eaglewire.fastcpu.compiled_body import FUSED, FUSED_ROWS

    timed = []

    def fake_time(candidates, ks, reps, run, **_):
        timed.append((candidates, ks))
        for lay in candidates:
            run(lay, ks[0])  # each variant runs (and compiles) once, as the real warm-up does
        return {ks[0]: winner}, {ks[0]: {lay: 1.0 if lay == winner else 2.0 for lay in candidates}}

    monkeypatch.setattr(runtime, "time_layouts", fake_time)
    big = max(FUSED_ROWS) + 1
    monkeypatch.setattr(panel_gemm, "available", lambda kernel, dtype: False)  # a host without the panel GEMMs
    lean = FastRuntime(build_target("llama"), max_len=CALIBRATION_PREFIX + big, layout=GRAPH)  # room: not why it skips
    assert PANEL not in lean.candidates and PANEL not in lean.layers[0].qkv.offered
    rows = lean.compile_graphs(verify_rows=(3, big))
    assert timed == [((GRAPH, FUSED), (3,))] and rows == [1, 3]  # a fixed policy {1: GRAPH}: 1 row, then 3
    assert lean.graph.fused == ({3} if winner == FUSED else set())
    assert lean.fused_ms == {3: {GRAPH: 1.0 if winner == GRAPH else 2.0, FUSED: 1.0 if winner == FUSED else 2.0}}


def test_no_fused_graph_is_built_where_the_panel_gemm_is_offered(monkeypatch):
    """The shared graph's GEMM is then the panel GEMM, which beat the fused graphs at every size timed
    (runtime.compile_graphs): asking for verify sizes compiles none of them."""
    if not graph_offered() or PANEL not in candidate_layouts(torch.float32):
        pytest.skip(NO_GRAPH + ", or the panel GEMM is not offered here")
    from eaglewire.fastcpu import runtime

    monkeypatch.setattr(runtime, "time_layouts", lambda *a, **k: pytest.fail("nothing should be timed"))
    lean = FastRuntime(build_target("llama"), max_len=CALIBRATION_PREFIX + 8, layout=GRAPH)
    assert lean.compile_graphs(verify_rows=(3, 4)) == [1] and lean.graph.fused == set() and lean.fused_ms == {}


def _both_graph_gemms_offered() -> bool:
    return graph_offered() and PANEL in candidate_layouts(torch.float32)


@pytest.mark.parametrize("faster", ["panel", "dnnl"])
def test_the_calibration_gives_the_graph_the_multi_row_gemm_timed_faster(monkeypatch, faster):
    """The graph's GEMM for two or more rows is measured per machine (an AVX-512 oneDNN may beat a panel
    GEMM), by the geometric mean over 2-16 rows; a changed choice gets a fresh CompiledBody, whose graphs
    still give HF's logits."""
    if not _both_graph_gemms_offered():
        pytest.skip(NO_GRAPH + ", or the panel GEMM is not offered here")
    from eaglewire.fastcpu import runtime

    other = PACKED if faster == PANEL else PANEL
    # `faster` twice as fast at 2 and 4 rows, 1.5x slower at 16: the ratios decide, not the 16-row ms
    ms = {2: {faster: 1.0, other: 2.0}, 4: {faster: 2.0, other: 4.0}, 16: {faster: 12.0, other: 8.0}}
    slow = {lay: 99.0 for lay in PANELS if lay not in (faster, other)}  # another panel kernel, where offered
    monkeypatch.setattr(
        runtime, "time_layouts", lambda cands, ks, reps, run, **_: ({}, {k: {**ms[k], **slow} for k in ks})
    )
    target = build_target("llama")
    lean = FastRuntime(target, max_len=24, layout=GRAPH)
    first = lean.graph
    lean._calibrate_graph_gemm((1, 2, 4, 16, 32), reps=1, refine=0)
    assert (
        lean.graph_gemm == faster
        and lean.graph.gemm == faster
        and lean.graph_gemm_ms == {k: {**v, **slow} for k, v in ms.items()}
    )
    assert (lean.graph is first) == (faster == PANEL)  # the panel GEMM was the default: no new body then
    assert lean.eager_layout(3) == faster
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits
    lean.forward(ids[:, :9], torch.arange(9)[None], 0)
    logits, _ = lean.forward(ids[:, 9:], torch.arange(9, 12)[None], 9)  # 3 rows: the multi-row graph
    torch.testing.assert_close(logits, ref[:, 9:], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="not offered here"):
        lean.set_graph_gemm("tn")
