"""The step losses (train/ttt.py: LOSSES) against independent definitions, and each one trains a tiny draft."""

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_train import _setup
from tiny import tiny_samples

from eaglewire.train.loop import TrainConfig, train
from eaglewire.train.ttt import LK_ETA, LOSSES, lk_hybrid_loss, nla_loss

logits = st.integers(0, 2**31 - 1).map(lambda seed: torch.randn(6, 11, generator=torch.Generator().manual_seed(seed)))


def _tv(d: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Total variation as half the L1 distance: alpha = 1 - TV, computed without min()."""
    return 0.5 * (F.softmax(d, -1) - F.softmax(t, -1)).abs().sum(-1)


@settings(max_examples=25, deadline=None)
@given(logits, logits)
def test_acceptance_losses_match_total_variation(d, t):
    assert torch.allclose(nla_loss(d, t), -torch.log(1 - _tv(d, t)), atol=1e-5)
    lam = torch.exp(-LK_ETA * (1 - _tv(d, t)))
    kl = (F.softmax(t, -1) * (F.log_softmax(t, -1) - F.log_softmax(d, -1))).sum(-1)
    assert torch.allclose(lk_hybrid_loss(d, t), lam * kl + (1 - lam) * _tv(d, t), atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(logits, logits)
def test_every_loss_is_smallest_at_the_target(t, noise):
    """At q == p the divergences are 0 and soft CE is H(p); any other q costs more (greedy_ce: at the argmax)."""
    other = t + noise  # drawn by hypothesis, not the global RNG: a failure replays
    for name, f in LOSSES.items():
        if name == "greedy_ce":
            # a point mass on the target's top-1 wins; t * 50 is no point mass where two logits nearly tie
            peaked = F.one_hot(t.argmax(-1), t.shape[-1]).float() * 50
            assert (f(peaked, t) <= f(other, t) + 1e-6).all(), name
            continue
        at_p = f(t, t)
        assert (at_p <= f(other, t) + 1e-5).all(), name
        if name != "soft_ce":
            assert torch.allclose(at_p, torch.zeros_like(at_p), atol=1e-5), name


@settings(max_examples=25, deadline=None)
@given(logits, logits)
def test_nla_against_a_point_mass_is_greedy_cross_entropy(d, t):
    """-log alpha reduces to CE on the top-1 when the target is one-hot: greedy verification's case."""
    one_hot = F.one_hot(t.argmax(-1), t.shape[-1]).float() * 1e4  # softmax of this is a point mass
    assert torch.allclose(nla_loss(d, one_hot), LOSSES["greedy_ce"](d, t), atol=1e-4)


def test_lk_hybrid_blend_weight_carries_no_gradient():
    d = torch.randn(4, 9, requires_grad=True)
    t = torch.randn(4, 9)
    lk_hybrid_loss(d, t).sum().backward()
    got = d.grad.clone()
    d.grad = None
    lam = torch.exp(-LK_ETA * (1 - _tv(d, t))).detach()  # a constant blend: gradients only through KL and TV
    kl = (F.softmax(t, -1) * (F.log_softmax(t, -1) - F.log_softmax(d, -1))).sum(-1)
    (lam * kl + (1 - lam) * _tv(d, t)).sum().backward()
    assert torch.allclose(got, d.grad, atol=1e-6)


@pytest.mark.parametrize("loss", ["nla", "lk_hybrid", "greedy_ce"])
def test_each_loss_trains_a_tiny_draft(tmp_path, loss):
    target, vmap, contract, feats = _setup()
    with torch.no_grad():  # sharpen the random tiny target so its top-1 is learnable
        target.model.lm_head.weight.mul_(30)
    samples = tiny_samples(24)
    c = TrainConfig(
        max_steps=30, batch_size=4, lr=3e-3, warmup_steps=5, eval_every=30, ckpt_every=30, ttt_steps=2, loss=loss
    )
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    acc = [r["acc"][0] for r in rows if r["split"] == "train"]
    assert sum(acc[-5:]) / 5 > sum(acc[:5]) / 5 + 0.15, (loss, acc[:5], acc[-5:])


def test_unknown_loss_is_refused(tmp_path):
    target, vmap, contract, feats = _setup()
    c = TrainConfig(max_steps=1, batch_size=2, loss="tv")
    with pytest.raises(ValueError, match="loss must be one of soft_ce"):
        train(target, contract, vmap, feats, tiny_samples(4), tiny_samples(2), c, tmp_path)
