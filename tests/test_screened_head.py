"""The screened greedy head: the fp32 head's argmax, exactly, read through a bf16 copy. The bound holds,
near-ties that bf16 alone gets wrong come out right, torch.argmax's tie rule is kept, and greedy decoding
through it equals the plain head's, on tiny targets and the embedded one (test_embedded_target.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import build_target

from eaglewire.decoding.engine import greedy_reference
from eaglewire.decoding.gemm import PACKED, candidate_layouts
from eaglewire.decoding.runtime import LeanTarget
from eaglewire.decoding.screened_head import PLAIN, SCREENED, U_BF16, ScreenedHead, greedy_heads

# bf16 through oneDNN's packed weight where this CPU has it natively, a plain bf16 matmul everywhere
PACKINGS = [False] + ([True] if PACKED in candidate_layouts(torch.bfloat16) else [])


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
    bf16_only = head.lo(h.to(torch.bfloat16), head.layout).float().argmax(-1)
    assert (bf16_only != exact).sum() >= 10  # the case exists: without the recompute this test fails
    assert torch.equal(head.argmax(h), exact)
    assert torch.equal(head.argmax(h.view(4, 64, -1)), exact.view(4, 64))  # any leading shape


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), w_scale=st.floats(1e-3, 1e2), h_scale=st.floats(1e-3, 1e2))
def test_the_bound_covers_the_bf16_error_at_every_scale(seed, w_scale, h_scale):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(512, 64, generator=g) * w_scale * torch.rand(512, 1, generator=g)  # rows of varied norm
    h = torch.randn(8, 64, generator=g) * h_scale
    head = ScreenedHead(W, packed=False)
    y = head.lo(h.to(torch.bfloat16), head.layout).float()  # [8, 512] the screen's logits
    err = (head.c * h.norm(dim=1, keepdim=True)) * head.row_norm + (U_BF16 / (1 - U_BF16)) * y.abs()
    real = h.double() @ W.double().t()
    assert ((y.double() - real).abs() <= err.double()).all()
    assert ((h @ W.t()).double() - real).abs().le(err.double()).all()  # the fp32 reference's own error too
    assert torch.equal(head.argmax(h), (h @ W.t()).argmax(-1))


def test_ties_go_to_the_lowest_index_and_broken_states_to_the_plain_product():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(300, 32, generator=g)
    W[250] = W[40]  # exact duplicates: torch.argmax returns the first
    head = ScreenedHead(W, packed=False)
    h = W[40:41] * 5
    assert int(head.argmax(h)) == int((h @ W.t()).argmax(-1)) == 40
    bad = torch.full((2, 32), float("nan"))
    bad[1] = float("inf")
    assert torch.equal(head.argmax(bad), (bad @ W.t()).argmax(-1))
    with pytest.raises(ValueError, match="fp32"):
        ScreenedHead(W.to(torch.bfloat16), packed=False)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_decoding_through_the_screen_equals_the_plain_head(arch):
    target = build_target(arch)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(5))
    plain = LeanTarget(target, 96, head=PLAIN)
    screened = LeanTarget(target, 96)
    screened.screen, screened.head_policy = ScreenedHead(screened.head.w, packed=False), {1: SCREENED}  # on any CPU
    assert greedy_reference(screened, prompt, 40) == greedy_reference(plain, prompt, 40)
    ids, pos = prompt, torch.arange(9)[None]
    logits, taps = plain.forward(ids, pos, 0, taps=(1,))
    toks, taps2 = screened.greedy(ids, pos, 0, taps=(1,))
    assert torch.equal(toks, logits.argmax(-1)) and torch.equal(taps, taps2)


def test_the_screen_is_offered_only_for_fp32_with_native_bf16():
    heads = greedy_heads(torch.float32)
    assert heads == ((PLAIN, SCREENED) if PACKED in candidate_layouts(torch.bfloat16) else (PLAIN,))
    assert greedy_heads(torch.bfloat16) == (PLAIN,)
    target = build_target("llama")
    if SCREENED not in heads:
        with pytest.raises(Exception, match="greedy head 'screened' is not available here"):
            LeanTarget(target, 16, head=SCREENED)
    target.model.to(torch.bfloat16)
    rt = LeanTarget(target, 16)
    assert rt.screen is None and rt.head_policy == {1: PLAIN}

