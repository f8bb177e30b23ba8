"""The screened greedy head: the fp32 head's argmax, exactly, read through a bf16 copy. The bound holds,
near-ties that bf16 alone gets wrong come out right, torch.argmax's tie rule is kept, and greedy decoding
through it equals the plain head's, on tiny targets and the embedded one (test_embedded_target.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from proposers import OracleProposer, RandomProposer
from tiny import VOCAB, build_target

from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.fastcpu.gemm import PACKED, candidate_layouts
from eaglewire.fastcpu.runtime import FastRuntime
from eaglewire.fastcpu.screened_head import PLAIN, SCREENED, ScreenedHead, greedy_heads
from eaglewire.decoding.tree import TreeShape
from eaglewire.errors import TargetError
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

# bf16 through oneDNN's packed weight where this CPU has it natively, a plain bf16 matmul everywhere
PACKINGS = [False] + ([True] if PACKED in candidate_layouts(torch.bfloat16) else [])
MAX_KEPT = 4  # candidates per state in the near-tie test: each pair, rarely a neighbour


def _near_ties(V: int = 2048, H: int = 96, N: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A head whose rows come in pairs a hair apart (relative 1e-3, below bf16's resolution) and states
    leaning toward one pair: the fp32 argmax is decided by differences bf16 rounds away."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(V // 2, H, generator=g)
    W = torch.cat([base, base * (1 + 1e-3 * torch.randn(V // 2, H, generator=g))])  # [V, H]
    pick = torch.randint(0, V // 2, (N,), generator=g)
    h = 3 * base[pick] + 0.3 * torch.randn(N, H, generator=g)  # [N, H]
    return W, h


@pytest.mark.parametrize("packed", PACKINGS, ids=lambda p: "packed" if p else "plain-bf16")
def test_the_screen_finds_the_fp32_argmax_where_bf16_alone_does_not(packed):
    W, h = _near_ties()
    head = ScreenedHead(W, packed)
    exact = (h @ W.t()).argmax(-1)  # [N]
    bf16_only = head.screen(h).argmax(-1)
    assert (bf16_only != exact).sum() >= 10  # the case exists: without the recompute this test fails
    assert head.candidates(h).sum(1).max() <= MAX_KEPT  # and the screen prunes: a pair, give or take
    assert torch.equal(head.argmax(h), exact)
    assert torch.equal(head.argmax(h.view(4, 64, -1)), exact.view(4, 64))  # any leading shape


@pytest.mark.parametrize("packed", PACKINGS, ids=lambda p: "packed" if p else "plain-bf16")
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), w_scale=st.floats(1e-3, 1e2), h_scale=st.floats(1e-3, 1e2))
def test_the_bound_covers_the_bf16_error_at_every_scale(packed, seed, w_scale, h_scale):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(512, 64, generator=g) * w_scale * torch.rand(512, 1, generator=g)  # rows of varied norm
    h = torch.randn(8, 64, generator=g) * h_scale
    head = ScreenedHead(W, packed)
    y = head.screen(h)  # [8, 512] the screen's logits
    real = h.double() @ W.double().t()
    err = head.bound(h, y)
    assert ((y.double() - real).abs() <= err.double()).all()
    per_token = (y + err) >= (y - err).amax(1, keepdim=True)  # the tight test
    assert not (per_token & ~head.candidates(h, y)).any()  # the screen's cheaper test keeps a superset
    assert torch.equal(head.argmax(h), (h @ W.t()).argmax(-1))


@pytest.mark.parametrize("packed", PACKINGS, ids=lambda p: "packed" if p else "plain-bf16")
def test_the_input_rounding_term_is_tight(packed):
    """Inputs a hair below bf16's midpoint 1 + 2^-8 all round down to 1: the screen loses 2^-7 of every
    product, in one direction, and |h| = |w| element-wise makes Cauchy-Schwarz an equality. A coefficient
    much smaller than the derived one fails here, which random data (far below the bound) cannot show."""
    n = 576
    x = torch.full((1, n), 1 + 2.0**-8 - 2.0**-20)
    head = ScreenedHead(x.clone(), packed)
    y = float(head.screen(x))  # n: exact in bf16, so the output's rounding adds nothing here
    lost = float(x.double() @ x.double().t()) - y
    input_term = head.c * float(x.norm()) ** 2
    assert y == n and 0.95 * input_term <= lost <= input_term


def test_ties_go_to_the_lowest_index_and_broken_states_to_the_plain_product():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(300, 32, generator=g)
    W[250] = W[40]  # exact duplicates: torch.argmax returns the first
    head = ScreenedHead(W, packed=False)
    h = W[40:41] * 5
    assert int(head.argmax(h)) == int((h @ W.t()).argmax(-1)) == 40
    bad = torch.randn(3, 32, generator=g)
    bad[1], bad[2, 5] = float("nan"), float("inf")
    assert torch.equal(head.argmax(bad), (bad @ W.t()).argmax(-1))  # the finite row included
    huge = ScreenedHead(W * 1e37, packed=False)  # the products overflow (bf16 and fp32 alike): inf - inf
    assert torch.equal(huge.argmax(h), (h @ (W * 1e37).t()).argmax(-1))
    with pytest.raises(ValueError, match="fp32"):
        ScreenedHead(W.to(torch.bfloat16), packed=False)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_decoding_through_the_screen_equals_the_plain_head(arch):
    target = build_target(arch)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(5))
    plain = FastRuntime(target, 96, head=PLAIN)
    screened = FastRuntime(target, 96)
    screened.screen, screened.head_policy = ScreenedHead(screened.head.w, packed=False), {1: SCREENED}  # on any CPU
    assert greedy_reference(screened, prompt, 40) == greedy_reference(plain, prompt, 40)
    ids, pos = prompt, torch.arange(9)[None]
    logits, taps = plain.forward(ids, pos, 0, taps=(1,))
    toks, taps2 = screened.greedy(ids, pos, 0, taps=(1,))
    assert torch.equal(toks, logits.argmax(-1)) and torch.equal(taps, taps2)


def test_the_screen_is_offered_only_for_fp32_with_native_bf16(monkeypatch):
    heads = greedy_heads(torch.float32)
    assert heads == ((PLAIN, SCREENED) if PACKED in candidate_layouts(torch.bfloat16) else (PLAIN,))
    assert greedy_heads(torch.bfloat16) == (PLAIN,)
    target = build_target("llama")
    monkeypatch.setenv("EAGLEWIRE_NO_BF16", "1")  # a CPU without native bf16, as hw.native_bf16 reads it
    assert greedy_heads(torch.float32) == (PLAIN,)
    with pytest.raises(TargetError, match="greedy head 'screened' is not available here"):
        FastRuntime(target, 16, head=SCREENED)
    rt = FastRuntime(target, 16)
    assert rt.screen is None and rt.head_policy == {1: PLAIN}
    monkeypatch.delenv("EAGLEWIRE_NO_BF16")
    target.model.to(torch.bfloat16)
    rt = FastRuntime(target, 16)
    assert rt.screen is None and rt.head_policy == {1: PLAIN}


def test_a_mixed_head_policy_keeps_speculative_decoding_lossless():
    """Verify rounds of 1 and 4 rows through the screen, 2-3 rows through the plain head (a calibration
    can answer that): the same tokens as plain greedy decoding, always-right and random drafts alike."""
    target = build_target("llama")
    prompt = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    ref = greedy_reference(FastRuntime(target, 128, head=PLAIN), prompt, 40)
    rt = FastRuntime(target, 128)
    rt.screen, rt.head_policy = ScreenedHead(rt.head.w, packed=False), {1: SCREENED, 2: PLAIN, 4: SCREENED}
    for k in (1, 2, 3):  # verify rounds of k + 1 rows
        for proposer in (OracleProposer(ref, TreeShape.chain(k)), RandomProposer(VOCAB, TreeShape.chain(k))):
            out, _ = SpecDecoder(rt, proposer).generate(prompt, 40)
            assert out == ref


@pytest.mark.parametrize("packed", PACKINGS, ids=lambda p: "packed" if p else "plain-bf16")
def test_many_uniform_candidates_are_pruned_by_the_per_token_test_and_stay_exact(packed, monkeypatch):
    """One row of large norm inflates the uniform test's E, so it keeps every token whose logit is within 2E
    of the top (a flat distribution does the same to SmolLM2's head); the per-token test then prunes them
    before the fp32 recompute, and the argmax is still the plain product's, for one row and for several."""
    from eaglewire.fastcpu.screened_head import REFINE_ABOVE

    g = torch.Generator().manual_seed(2)
    H, V = 64, 1000
    W = torch.zeros(V, H)
    W[:, 0] = 0.9 * torch.rand(V, generator=g)  # small rows, logits 0..9 for h ~ 10 e_0
    W[:, 2:] = 1e-3 * torch.randn(V, H - 2, generator=g)
    W[123, 0] = 1.0  # the top token
    W[456, 0], W[456, 1] = 0.5, 100.0  # large norm, orthogonal to h: it sets E
    h = torch.zeros(3, H)
    h[:, 0] = 10.0
    h[:, 2:] = 1e-2 * torch.randn(3, H - 2, generator=g)
    head = ScreenedHead(W, packed)
    y = head.screen(h)
    uniform = head.candidates(h, y)
    tight = head._tight(h, y, torch.arange(V))
    assert (uniform.sum(1) > REFINE_ABOVE).all() and (tight.sum(1) <= 4).all()  # the refinement runs, and prunes
    assert not (tight & ~uniform).any()
    calls = []
    real = ScreenedHead._tight
    monkeypatch.setattr(ScreenedHead, "_tight", lambda self, *a: calls.append(a[0].shape[0]) or real(self, *a))
    assert torch.equal(head.argmax(h), (h @ W.t()).argmax(-1)) and (head.argmax(h) == 123).all()
    assert int(head.argmax(h[1:2])) == int((h[1:2] @ W.t()).argmax(-1)) == 123
    assert calls == [3, 3, 1]  # argmax pruned through the per-token test on the multi-row and one-row paths
