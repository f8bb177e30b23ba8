"""A runtime holds only the weight copies its chosen layouts read: built when first used (gemm.Gemm.copy,
prepare), the rest freed (keep, FastRuntime.settle_copies); HF's q/k/v and gate/up weights are views of its
fused ones; results are the same throughout, and a calibration builds what it times."""

import pytest
import torch
from tiny import VOCAB, build_target

from eaglewire.fastcpu.gemm import COPIES, PACKED, Gemm, candidate_layouts
from eaglewire.fastcpu.start import make_fast_runtime as make_runtime
from eaglewire.fastcpu.runtime import FastRuntime
from eaglewire.fastcpu.screened_head import PLAIN, SCREENED, ScreenedHead
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

OFFERED = candidate_layouts(torch.float32, compiled=False)


def _linear() -> tuple[Gemm, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lin = Gemm(torch.randn(40, 24, generator=g), torch.randn(40, generator=g), OFFERED)
    return lin, torch.randn(1, 3, 24, generator=g)  # x [1, 3, in]


def test_copies_are_built_when_first_used_and_keep_frees_them():
    lin, x = _linear()
    assert lin.copies == {} and lin.absent == {lay for lay in COPIES if lay in OFFERED}  # nothing copied yet
    before = {lay: lin(x, lay) for lay in OFFERED}
    copies = dict(lin.copies)
    assert set(copies) == {lay for lay in COPIES if lay in OFFERED} and not lin.absent
    expected = sum(t.numel() * 4 for t in copies.values())
    assert lin.keep({"nt"}) == expected > 0
    assert lin.copies == {} and lin.absent == set(copies) and lin.w is not None
    assert torch.equal(lin(x, "nt"), before["nt"]) and torch.equal(lin(x, "wx"), before["wx"])
    assert lin.keep({"nt"}) == 0  # nothing left to free
    assert torch.equal(lin(x, "tn"), before["tn"]) and set(lin.copies) == {"tn"}  # built again when used
    lin.prepare()
    assert not lin.absent
    for lay in OFFERED:
        torch.testing.assert_close(lin(x, lay), before[lay], atol=0, rtol=0)
    with pytest.raises(ValueError, match="'inductor' copy of this weight was never offered"):
        lin.copy("inductor")


def test_an_absent_copy_is_not_built_inside_a_traced_graph(monkeypatch):
    """Built there, it would be part of the graph and rebuilt every call: the runtime builds it first."""
    lin, x = _linear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="'tn' copy of this weight is absent while a graph is traced"):
        lin(x, "tn")
    monkeypatch.undo()
    lin.prepare(("tn",))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert lin(x, "tn").shape == (1, 3, 40)  # held: read as is


def test_a_shared_fused_weight_is_the_modules_weights_and_leaves_their_outputs_unchanged():
    g = torch.Generator().manual_seed(1)
    mods = [torch.nn.Linear(16, n, bias=b) for n, b in ((8, True), (4, False), (4, True))]
    x = torch.randn(2, 16, generator=g)
    with torch.no_grad():
        refs = [m(x) for m in mods]
        lin = Gemm.fused(mods, share=True)
        outs = [m(x) for m in mods]
    base = lin.w.untyped_storage().data_ptr()
    assert all(m.weight.untyped_storage().data_ptr() == base for m in mods)  # views of the fused weight
    assert mods[0].bias.untyped_storage().data_ptr() == lin.b.untyped_storage().data_ptr()
    for ref, out in zip(refs, outs):
        assert torch.equal(ref, out)
    assert torch.equal(lin(x, "nt"), torch.cat(refs, dim=-1))
    unshared = [torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)]
    copied = Gemm.fused(unshared)  # the default: a copy, the modules keep their own weights
    assert all(m.weight.untyped_storage().data_ptr() != copied.w.untyped_storage().data_ptr() for m in unshared)


@pytest.mark.parametrize("policy", [{1: "tn", 2: "nt"}, {1: "nt"}, {1: "graph"}])
def test_settle_copies_holds_what_the_policy_reads_and_computes_the_same(policy):
    target = build_target("llama")
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    rt = FastRuntime(target, max_len=160, compiled=False)  # room for calibrate()
    rt.policy = policy
    if 1 in policy and policy[1] == "graph":  # no graph is built here: only the layouts it stands for matter
        rt.graph_gemm = PACKED
    used = rt.used_layouts()
    assert used == {"graph": {PACKED}}.get(policy[1], set(policy.values()))
    if policy[1] == "graph":
        return  # what eager_layout maps GRAPH to is all this case checks (its graph needs inductor)
    lins = rt.linears()
    assert all(lin.copies == {} for lin in lins)  # nothing copied before a use
    rt.prepare_copies()  # every candidate's, as a calibration has them
    ref, _ = rt.forward(ids, torch.arange(9)[None], 0)
    sizes = sum(t.numel() * 4 for lin in lins for t in lin.copies.values())  # every copy, fp32
    freed = rt.settle_copies()
    for lin in lins:
        assert set(lin.copies) == {"tn"} & used
    assert freed == sizes - sum(t.numel() * 4 for lin in lins for t in lin.copies.values()) > 0
    out, _ = rt.forward(ids, torch.arange(9)[None], 0)
    assert torch.equal(out, ref)
    rt.calibrate(ks=(1, 2), reps=1, refine=0)  # times every candidate: their copies are built
    assert all(not lin.absent for lin in lins)


def test_the_screened_head_is_freed_where_the_head_policy_never_picks_it(monkeypatch):
    target = build_target("llama")
    rt = FastRuntime(target, max_len=32, compiled=False, layout="nt")
    # as a native-bf16 host has it (its screen unpacked: oneDNN's bf16 packing needs that host)
    monkeypatch.setattr(rt, "_new_screen", lambda: ScreenedHead(rt.head.w, packed=False))
    rt.screen, rt.screen_usable = rt._new_screen(), True
    rt.head_policy = {1: SCREENED, 4: PLAIN}
    rt.settle_copies()
    assert rt.screen is not None  # picked for one row: kept
    rt.head_policy = {1: PLAIN}
    screen = rt.screen.nbytes()
    assert screen > 0 and rt.settle_copies() == screen and rt.screen is None
    rt.prepare_copies()
    assert rt.screen is not None


def test_make_runtime_holds_what_its_policy_reads_and_says_what_it_freed(tmp_path, monkeypatch):
    from eaglewire.fastcpu import calibration

    monkeypatch.setattr(calibration, "cache_root", lambda: tmp_path)  # calibrates here, whatever ran before
    target = build_target("llama")
    said: list[str] = []
    rt = make_runtime(target, 32, log=said.append)  # uncalibrated: nothing built beyond its policy's
    assert rt.used_layouts() == {"tn", "nt"} and not any(m.startswith("freed ") for m in said)
    assert all(set(lin.copies) == {"tn"} for lin in rt.linears())  # built at the start, not in a request
    said.clear()
    rt = make_runtime(target, 32, calibrate=True, log=said.append, compile="never")  # times (and builds) them all
    used = rt.used_layouts()
    assert all(set(lin.copies) == set(COPIES) & used for lin in rt.linears())
    unused = sorted(lay for lay in COPIES if lay in rt.candidates and lay not in used)
    screen_unused = rt.screen_usable and SCREENED not in rt.head_policy.values()  # a native-bf16 host
    assert (rt.screen is not None) == (rt.screen_usable and not screen_unused)
    freed = [m for m in said if m.startswith("freed ")]
    assert len(freed) == (1 if unused or screen_unused else 0), said
    assert not freed or freed[0].endswith(f"(layouts in use: {', '.join(sorted(used))})")


def test_a_compiled_graph_runs_after_the_release_and_still_gives_hfs_logits():
    """The graph traced with every copy present, then released to what it reads (its multi-row GEMM's copy;
    the one-row GEMV reads W): prefill, one-row and multi-row steps still match HF."""
    from eaglewire.fastcpu.compiled_body import GRAPH, target_layouts

    if GRAPH not in target_layouts(torch.float32):
        pytest.skip("no inductor graph offered here (fastcpu/compiled_body.py)")
    target = build_target("llama")
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits  # [1, 12, V]
    rt = FastRuntime(target, max_len=32, layout=GRAPH)

    def run() -> list[torch.Tensor]:
        return [
            rt.forward(ids[:, :9], torch.arange(9)[None], 0)[0],  # a prefill: eager, the graph's GEMM
            rt.forward(ids[:, 9:10], torch.arange(9, 10)[None], 9)[0],  # one row: the GEMV graph
            rt.forward(ids[:, 9:12], torch.arange(9, 12)[None], 9)[0],
        ]  # three rows: the multi-row graph

    rt.prepare_copies()  # every candidate's copies, as after a calibration
    before = run()  # compiles both graphs with every copy present
    assert rt.settle_copies() > 0 and rt.used_layouts() == {rt.graph_gemm}
    assert all(set(lin.copies) == {rt.graph_gemm} for lin in rt.linears())
    after = run()
    for got, want in zip(after, (ref[:, :9], ref[:, 9:10], ref[:, 9:12])):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for a, b in zip(after, before):
        assert torch.equal(a, b)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    graphs = len(_debug_get_cache_entry_list(rt.graph.code))
    rt.policy = {1: "nt"}  # a policy without the graph: its GEMM's copies go
    rt.settle_copies()
    assert all(rt.graph_gemm not in lin.copies for lin in rt.linears())
    rt.policy = {1: GRAPH}
    again = run()  # the graph builds its GEMM's copies before its call, and reads the new ones
    assert all(torch.equal(a, b) for a, b in zip(again, before))
    assert len(_debug_get_cache_entry_list(rt.graph.code)) == graphs  # no recompile
