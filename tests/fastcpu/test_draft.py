"""The draft's accelerated decoding copy (fastcpu/draft.py): the same logits
and hidden states as the draft's own modules for every layout and norm flag set, the caller's draft left
untouched, the target embedding shared, and the proposer drafting the same tokens either way."""

import time
from types import SimpleNamespace

import pytest
import torch
from tiny import build_draft, build_target

from eaglewire.norms import NormFlags
from eaglewire.fastcpu.draft import LayoutLinear, FastDraft
from eaglewire.decoding.propose import EagleProposer
from eaglewire.fastcpu import gemm
from eaglewire.fastcpu.gemm import candidate_layouts
from eaglewire.fastcpu.screened_head import SCREENED, ScreenedHead
from eaglewire.decoding.tree import TreeShape
from eaglewire.draft.model import DraftCache
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

NORMS = {
    "eagle3": NormFlags(),
    "speculators": NormFlags(norm_before_residual=True, norm_output=True),
    "fc_norm": NormFlags(fc_norm=True),
    "norm_before_fc": NormFlags(norm_before_fc=True),
    "eagle3.1": NormFlags(fc_norm=True, norm_output=True),
}  # the default of a new draft


def _forward(model, ids, taps, cfg):
    cache = DraftCache(cfg, 1, 32)
    with torch.no_grad():
        first = model(ids, taps, cache=cache, start=0)
        nxt = model.step(
            ids[:, -1:], first.hidden[:, -1:], torch.tensor([[ids.shape[1]]]), None, cache=cache, start=ids.shape[1]
        )
    return first, nxt


@pytest.mark.parametrize("norm", list(NORMS), ids=list(NORMS))
@pytest.mark.parametrize("layers", [1, 2])
def test_every_layout_computes_what_the_draft_modules_compute(norm, layers):
    target = build_target("llama")
    draft, _ = build_draft(target, norm=NORMS[norm], num_layers=layers, seed=3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (1, 5), generator=g)
    taps = torch.randn(1, 5, 3 * target.hidden_size, generator=g)
    ref_first, ref_next = _forward(draft, ids, taps, draft.cfg)
    for layout in candidate_layouts(torch.float32):
        lean = FastDraft(draft, layout)
        assert (
            sum(isinstance(m, LayoutLinear) for m in lean.model.modules()) == 2 + 4 * layers
        )  # fc, head; qkv, o, gate_up, down
        first, nxt = _forward(lean.model, ids, taps, draft.cfg)
        for a, b in (
            (first.logits, ref_first.logits),
            (first.hidden, ref_first.hidden),
            (nxt.logits, ref_next.logits),
            (nxt.hidden, ref_next.hidden),
        ):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"layout {layout}")


def test_every_timed_calibration_call_follows_a_cache_flush(monkeypatch):
    """Decoding meets the draft's weights after the target's forward evicted them: the calibration times
    each layout and head the same way, never cache-hot back to back."""
    from eaglewire.fastcpu import draft as fast_draft
    from eaglewire.fastcpu.screened_head import greedy_heads

    events = []
    monkeypatch.setattr(gemm.CacheFlush, "__call__", lambda self: events.append("flush"))
    timer = time.perf_counter  # gemm's clock only (inductor, say, has its own)
    monkeypatch.setattr(gemm, "time", SimpleNamespace(perf_counter=lambda: events.append("timer") or timer()))
    draft, _ = build_draft(build_target("llama"))
    FastDraft(draft)  # auto: calibrates
    starts = events[::3]  # each timed call: flush, timer start, timer stop
    layouts, heads = candidate_layouts(torch.float32), greedy_heads(torch.float32)
    timed = sum(gemm.applies(lay, r) for lay in layouts for r in fast_draft.DRAFT_ROWS)
    base = 3 * fast_draft.DRAFT_REPS * (timed + len(heads))
    # plus, per row count or head whose runner-up came close, REFINE_REPS more of the two (gemm.time_layouts)
    assert len(events) >= base and (len(events) - base) % (3 * 2 * gemm.REFINE_REPS) == 0
    assert set(starts) == {"flush"} and set(events[1::3]) == set(events[2::3]) == {"timer"}


def test_the_copy_leaves_the_draft_alone_and_shares_the_target_embedding():
    target = build_target("llama")
    draft, _ = build_draft(target)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    lean = FastDraft(draft)  # auto: calibrates
    assert set(lean.policy) == {1, 2, 4} and set(lean.policy.values()) <= set(candidate_layouts(torch.float32))
    assert all(
        set(ms) == {lay for lay in candidate_layouts(torch.float32) if gemm.applies(lay, rows)}
        for rows, ms in lean.calibration_ms.items()
    )
    assert isinstance(draft.fc, torch.nn.Linear) and isinstance(lean.model.fc, LayoutLinear)
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    assert lean.model.embed_tokens.weight.data_ptr() == target.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="not available"):
        FastDraft(draft, "no-such-layout")


@pytest.mark.parametrize(
    "shape", [TreeShape.chain(3), TreeShape(num_steps=3, topk=2, num_draft_tokens=6)], ids=["chain", "tree"]
)
def test_the_proposer_drafts_the_same_tokens_on_either_path(shape):
    target = build_target("llama")
    draft, contract = build_draft(target, seed=7)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 256, (1, 9), generator=g)
    taps = torch.randn(1, 9, 3 * target.hidden_size, generator=g)
    trees = []
    for layout in ("module", "auto", "screened"):
        prop = EagleProposer(
            draft, shape, 64, None if layout == "module" else FastDraft(draft, "auto"), contract=contract
        )
        if layout == "screened":  # the chain's greedy head through a bf16 screen, on any CPU
            prop.lean.screen = ScreenedHead(draft.lm_head.weight, packed=False)
            prop.lean.head_policy = {1: SCREENED}
        prop.start(prompt, taps, 11)
        first = prop.propose()
        prop.accept(taps[:, :2], [first.tokens[0], 13])
        trees.append((first, prop.propose()))
    assert trees[0] == trees[1] == trees[2]


@pytest.mark.parametrize("layout", ["module", "auto"])
def test_the_chain_path_drafts_what_the_tree_walk_drafts_for_topk_1(layout):
    """propose() takes a mask-free argmax loop for chains; the general tree walk must agree with it, round
    after round (the committed entries and the overwritten node slots included)."""
    target = build_target("llama")
    draft, contract = build_draft(target, seed=5)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 256, (1, 12), generator=g)
    taps = torch.randn(1, 12, 3 * target.hidden_size, generator=g)
    props = [
        EagleProposer(
            draft, TreeShape.chain(4), 64, None if layout == "module" else FastDraft(draft, layout), contract=contract
        )
        for _ in range(2)
    ]
    for p in props:
        p.start(prompt, taps, 11)
    for r in range(4):
        chain, tree = props[0]._propose_chain(), props[1]._propose_tree()
        assert chain == tree and tree.parents == [-1, 0, 1, 2]
        # the same keys/values in the same slots (positions and slots of every node, not only the argmax)
        torch.testing.assert_close(props[0].cache.k, props[1].cache.k, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(props[0].cache.v, props[1].cache.v, rtol=1e-5, atol=1e-6)
        accepted = chain.tokens[: r % 3] + [17 + r]
        for p in props:
            p.accept(taps[:, r : r + len(accepted)], accepted)


def test_the_copy_frees_the_weight_copies_its_policy_never_reads_and_a_calibration_rebuilds_them():
    draft, _ = build_draft(build_target("llama"))
    g = torch.Generator().manual_seed(4)
    ids, taps = (
        torch.randint(0, 256, (1, 3), generator=g),
        torch.randn(1, 3, 3 * draft.cfg.target_hidden_size, generator=g),
    )
    held = FastDraft(draft, "tn")  # a layout that reads a copy: built at the start, not inside a request
    assert all(set(m.lin.copies) == {"tn"} for m in held.model.modules() if isinstance(m, LayoutLinear))
    lean = FastDraft(draft, "nt")
    lins = [m.lin for m in lean.model.modules() if isinstance(m, LayoutLinear)]
    assert all(lin.copies == {} for lin in lins)
    first, _ = _forward(lean.model, ids, taps, draft.cfg)
    ref, _ = _forward(draft, ids, taps, draft.cfg)
    torch.testing.assert_close(first.logits, ref.logits, rtol=1e-4, atol=1e-5)
    lean.calibrate()  # times every candidate: each its copies (until settle_copies)
    assert all(not lin.absent for lin in lins)
    lean.settle_copies()
    used = set(lean.policy.values())
    assert all(set(lin.copies) == set(gemm.COPIES) & used & set(lean.candidates) for lin in lins)
