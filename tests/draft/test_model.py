"""EAGLE-3 draft model: shapes, the refused width, norm options, several layers, frozen embedding."""

import pytest
import torch
from tiny import HIDDEN, VOCAB, build_draft, build_target

from eaglewire.norms import NormFlags
from eaglewire.errors import CheckpointError, TapWidthError
from eaglewire.draft.vocab import VocabMap, VocabMapError


@pytest.fixture(scope="module")
def target():
    return build_target("llama")


def _inputs(b=2, t=7, width=3 * HIDDEN):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (b, t), generator=g), torch.randn(b, t, width, generator=g)


def test_forward_accepts_three_taps(target):
    draft, contract = build_draft(target)
    ids, taps = _inputs()
    out = draft(ids, taps)
    assert out.logits.shape == (2, 7, 128) and out.hidden.shape == (2, 7, HIDDEN)
    assert draft.fc.in_features == contract.tap_width == 3 * HIDDEN
    # the draft's own hidden feeds the next step
    nxt = draft.step(ids, out.hidden)
    assert nxt.logits.shape == (2, 7, 128)


def test_single_layer_width_is_refused_not_skipped(target):
    """The silent `if h.shape[-1] != emb.shape[-1]: h = fc(h)` skip must be impossible."""
    draft, _ = build_draft(target)
    ids, one_tap = _inputs(width=HIDDEN)
    with pytest.raises(TapWidthError) as err:
        draft(ids, one_tap)
    msg = str(err.value)
    assert "3 taps x 64 = 192 channels" in msg and "64 channels = 1 tap(s) of width 64" in msg
    ids, taps = _inputs()
    with pytest.raises(TapWidthError, match="expected: 64"):
        draft.step(ids, taps)  # taps must go through fuse()


@pytest.mark.parametrize(
    "norm",
    [
        NormFlags(norm_before_fc=True),
        NormFlags(fc_norm=True),
        NormFlags(norm_output=True),
        NormFlags(norm_before_residual=True),
    ],
)
def test_eagle31_options_change_the_function(target, norm):
    base, _ = build_draft(target, seed=3)
    other, _ = build_draft(target, seed=3, norm=norm)
    ids, taps = _inputs()
    a, b = base(ids, taps), other(ids, taps)
    if norm.norm_output:
        torch.testing.assert_close(a.logits, b.logits)  # same logits, different state fed back
        assert not torch.allclose(a.hidden, b.hidden)
        torch.testing.assert_close(b.hidden, other.norm(a.hidden))
    else:
        assert not torch.allclose(a.logits, b.logits)


def test_mutually_exclusive_norms_refused():
    with pytest.raises(Exception, match="mutually exclusive"):
        NormFlags(norm_before_fc=True, fc_norm=True)


def test_multi_layer_draft(target):
    draft, _ = build_draft(target, num_layers=2)
    assert draft.layers[0].self_attn.q_proj.in_features == 2 * HIDDEN
    assert draft.layers[1].self_attn.q_proj.in_features == HIDDEN
    ids, taps = _inputs()
    assert draft(ids, taps).logits.shape == (2, 7, 128)


def test_embedding_is_targets_and_frozen(target):
    draft, _ = build_draft(target)
    assert draft.embed_tokens.weight.data_ptr() == target.embed_tokens.weight.data_ptr()
    ids, taps = _inputs()
    draft(ids, taps).logits.sum().backward()
    assert draft.embed_tokens.weight.grad is None and draft.fc.weight.grad is not None


def test_draft_without_embedding_refuses_to_run(target):
    from eaglewire.draft.model import Eagle3Draft

    draft, _ = build_draft(target)
    fresh = Eagle3Draft(draft.cfg).init_random()
    with pytest.raises(CheckpointError, match="no input embedding"):
        fresh(*_inputs())


def test_incremental_kv_matches_full_sequence(target):
    """Feeding tokens one at a time with the returned KV equals one causal pass (cache correctness)."""
    draft, _ = build_draft(target)
    ids, taps = _inputs(b=1, t=5)
    full = draft(ids, taps)
    past, logits = None, []
    for t in range(5):
        out = draft(ids[:, t : t + 1], taps[:, t : t + 1], past=past)
        past, logits = out.kv, logits + [out.logits]
    torch.testing.assert_close(torch.cat(logits, 1), full.logits, atol=1e-5, rtol=1e-5)


def test_draft_to_target_ids_uses_offsets(target):
    draft, _ = build_draft(target)
    assert draft.to_target_ids(torch.tensor([0, 1, 127])).tolist() == [0, 2, 254]


def test_vocab_map_invariants():
    vm = VocabMap.from_target_ids(torch.tensor([7, 3, 9]), 16)
    assert vm.d2t.tolist() == [3, 6, 7] and vm.target_ids.tolist() == [3, 7, 9] and int(vm.t2d.sum()) == 3
    with pytest.raises(VocabMapError, match="OFFSETS"):
        VocabMap(d2t=torch.tensor([3, 7, 15]), t2d=vm.t2d)  # absolute ids stored as offsets
    with pytest.raises(VocabMapError, match="strictly ascending"):
        VocabMap(d2t=torch.tensor([9, 2, 1]), t2d=vm.t2d)  # frequency-ordered
    bad = vm.t2d.clone()
    bad[0] = True
    with pytest.raises(VocabMapError, match="t2d.sum"):
        VocabMap(d2t=vm.d2t, t2d=bad)


def test_static_cache_matches_full_sequence(target):
    from eaglewire.draft.model import DraftCache

    draft, _ = build_draft(target, num_layers=2)
    ids, taps = _inputs(b=1, t=6)
    full = draft(ids, taps)
    cache = DraftCache(draft.cfg, batch=1, max_len=16)
    first = draft(ids[:, :4], taps[:, :4], cache=cache, start=0)  # prefix in one call
    rest = [draft(ids[:, t : t + 1], taps[:, t : t + 1], cache=cache, start=t).logits for t in (4, 5)]
    torch.testing.assert_close(torch.cat([first.logits] + rest, 1), full.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_caches_rope_rows_are_rope_tables_values(target, dtype):
    """Decoding looks RoPE up in the cache's table; training computes it per call: the same values, exactly
    (a wrong half, offset or dtype here would only lower acceptance)."""
    from eaglewire.draft.model import DraftCache, rope_rows
    from eaglewire.ops import rope_tables

    draft, _ = build_draft(target)
    cfg = draft.cfg
    cache = DraftCache(cfg, batch=1, max_len=300, dtype=dtype)
    positions = torch.tensor([[0, 1, 7, 7, 150, 299]])  # tree nodes share positions
    cos, ssin = rope_rows(cache.rope, positions)
    ref_cos, ref_ssin = rope_tables(positions, cfg.head_dim, cfg.rope_theta, dtype)
    assert cos.shape == ref_cos.shape == (1, 1, 6, cfg.head_dim) and cos.dtype == dtype
    assert torch.equal(cos, ref_cos) and torch.equal(ssin, ref_ssin)
