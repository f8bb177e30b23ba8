"""DFlash's block objective (train/block.py): the context/block mask, anchors, label alignment, slot weights; and
DFlash training through the one loop and the CLI: learning, bit-exact resume, five-tap capture."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_pipeline import tiny_dir  # noqa: F401  (the fixture: a tiny target with the real tokenizer)

from eaglewire.capture.features import FeatureBatch
from eaglewire.train.block import (
    BlockModel,
    block_inputs,
    block_labels,
    block_mask,
    block_positions,
    sample_anchors,
    slot_weights,
    valid_anchors,
)


@st.composite
def _batches(draw):
    B, T, Bk = draw(st.integers(1, 3)), draw(st.integers(2, 24)), draw(st.integers(2, 6))
    trained = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    return trained, Bk, draw(st.integers(1, 8)), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_no_query_sees_the_context_at_or_after_its_anchor_nor_another_block(case):
    trained, Bk, n, seed = case
    anchors, keep = sample_anchors(valid_anchors(trained), n, torch.Generator().manual_seed(seed))
    B, T = trained.shape
    N = anchors.shape[1]
    mask = block_mask(anchors, T, Bk)
    assert mask.shape == (B, N * Bk, T + N * Bk)
    for b in range(B):
        for q in range(N * Bk):
            j, p = q // Bk, int(anchors[b, q // Bk])
            seen_ctx = mask[b, q, :T].nonzero().flatten().tolist()
            assert seen_ctx == list(range(p)), (b, q, p, seen_ctx)  # every context position < anchor, nothing else
            seen_blk = mask[b, q, T:].nonzero().flatten().tolist()
            assert seen_blk == list(range(j * Bk, (j + 1) * Bk))  # its own block, bidirectionally


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_anchors_are_valid_distinct_sorted_and_at_most_asked(case):
    trained, Bk, n, seed = case
    valid = valid_anchors(trained)
    anchors, keep = sample_anchors(valid, n, torch.Generator().manual_seed(seed))
    for b in range(trained.shape[0]):
        kept = anchors[b][keep[b]].tolist()
        assert kept == sorted(set(kept)) and len(kept) == min(n, int(valid[b].sum()))
        assert all(trained[b, p] and trained[b, p + 1] for p in kept)
        assert not keep[b, len(kept) :].any()
    again = sample_anchors(valid, n, torch.Generator().manual_seed(seed))
    assert torch.equal(again[0], anchors)  # a pure function of the generator's seed


def test_labels_point_one_position_back_and_stop_at_untrained_or_outside():
    trained = torch.tensor([[0, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    anchors, keep = torch.tensor([[1, 5]]), torch.tensor([[True, True]])
    sup, src = block_labels(trained, anchors, keep, 3)
    assert block_positions(anchors, 3).tolist() == [[1, 2, 3, 5, 6, 7]]
    # block at 1: slots 1, 2 predict x_2, x_3 (trained); block at 5: slot 1 predicts x_6, slot 2 is past the end
    assert sup.tolist() == [[False, True, True, False, True, False]]
    assert src[sup].tolist() == [1, 2, 5]
    ids = block_inputs(torch.arange(10, 17)[None], anchors, 3, mask_token_id=99)
    assert ids.tolist() == [[11, 99, 99, 15, 99, 99]]


def test_slot_weights():
    w = slot_weights(4, 7.0)
    assert w[0] == 0 and w[1] == 1 and math.isclose(float(w[3]), math.exp(-2 / 7), rel_tol=1e-6)


class _Oracle(torch.nn.Module):
    """A 'draft' that reads the target's answer at block position - 1 + `shift` off the batch: shift 0 is the
    label the objective must use, so its loss is ~0 and every slot agrees; any other shift must not."""

    def __init__(self, top1: torch.Tensor, vocab: int, shift: int) -> None:
        super().__init__()
        self.top1, self.vocab, self.shift = top1, vocab, shift
        self.scale = torch.nn.Parameter(torch.tensor(50.0))

    def forward(self, ctx_taps, ctx_pos, block_ids, block_pos, mask):
        at = (block_pos - 1 + self.shift).clamp(0, self.top1.shape[1] - 1)
        return torch.nn.functional.one_hot(self.top1.gather(1, at), self.vocab).float()  # [N, Q, H=V]

    def logits(self, hidden):
        return hidden * self.scale


def _batch(V=32, T=20):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (2, T), generator=g)
    top1 = torch.randint(0, V, (2, T), generator=g)
    loss = torch.zeros(2, T, dtype=torch.long)
    loss[:, 6:] = 1
    head = torch.eye(V)  # final_hidden one-hot of top1 -> the target's logits peak at top1
    hid = torch.nn.functional.one_hot(top1, V).float() * 20
    return FeatureBatch(ids, loss, torch.ones_like(loss), torch.zeros(2, T, 8), hid, top1), head


def test_a_draft_that_knows_the_target_s_next_tokens_gets_zero_loss_and_full_acceptance():
    fb, head = _batch()
    for loss_kind in ("greedy_ce", "soft_ce"):
        good = BlockModel(
            _Oracle(fb.target_top1, 32, 0),
            head,
            block_size=4,
            mask_token_id=31,
            num_anchors=5,
            gamma=7.0,
            loss=loss_kind,
        )
        total, st = good(fb, draw=3)
        assert all(c == n > 0 for c, n in zip(st.correct, st.counts)), st
        assert st.chain == [st.anchors] * 3 and st.anchors > 0
        if loss_kind == "greedy_ce":
            assert float(total.detach()) < 1e-6
        bad = BlockModel(
            _Oracle(fb.target_top1, 32, 1),
            head,
            block_size=4,
            mask_token_id=31,
            num_anchors=5,
            gamma=7.0,
            loss=loss_kind,
        )
        worse, st_bad = bad(fb, draw=3)
        assert float(worse.detach()) > float(total.detach()) + 1 and sum(st_bad.correct) < sum(st.correct) / 2


class _ReducedOracle(_Oracle):
    """The oracle over a reduced vocabulary: its logits are the kept ids' columns (draft order)."""

    def __init__(self, top1, vocab, shift, kept):
        super().__init__(top1, vocab, shift)
        self.kept = kept

    def logits(self, hidden):
        return hidden[..., self.kept] * self.scale


def test_a_reduced_vocabulary_trains_on_the_tokens_it_holds_and_counts_the_others_as_misses():
    from eaglewire.draft.vocab import VocabMap

    fb, head = _batch()
    vmap = VocabMap.from_target_ids(torch.arange(0, 32, 2), 32)  # the even ids
    for loss_kind in ("greedy_ce", "soft_ce"):
        make = lambda shift: BlockModel(
            _ReducedOracle(fb.target_top1, 32, shift, vmap.target_ids),
            head,  # noqa: E731
            block_size=4,
            mask_token_id=31,
            num_anchors=5,
            gamma=7.0,
            loss=loss_kind,
            vocab=(vmap.d2t, vmap.t2d),
        )
        total, st = make(0)(fb, draw=3)
        full_total, full_st = BlockModel(
            _Oracle(fb.target_top1, 32, 0),
            head,
            block_size=4,
            mask_token_id=31,
            num_anchors=5,
            gamma=7.0,
            loss=loss_kind,
        )(fb, draw=3)
        assert st.counts == full_st.counts  # the same rows are scored
        assert 0 < sum(st.correct) < sum(st.counts)  # the odd top-1s cannot be drafted: misses, not dropped rows
        assert st.chain[0] < st.anchors
        if loss_kind == "greedy_ce":  # the rows it trains on (even top-1s) it gets right
            assert float(total.detach()) < 1e-6
        worse, _ = make(1)(fb, draw=3)
        assert float(worse.detach()) > float(total.detach()) + 1


# ---- the DFlash record through the one training loop --------------------------------------------------------


def _dflash_setup(block_size=4):
    from tiny import VOCAB, build_target

    from eaglewire.capture.features import OnlineFeatures
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.families import BlockWiring

    target = build_target("llama")
    contract = dflash_contract(target, (1, 2, 3), BlockWiring(block_size=block_size, mask_token_id=VOCAB - 1))
    return target, contract, OnlineFeatures(target, contract, pad_id=0)


def _metrics(path):
    import json

    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_dflash_training_learns_and_reports_per_slot_acceptance(tmp_path):
    from tiny import tiny_samples

    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.train.loop import TrainConfig, train

    target, contract, feats = _dflash_setup()
    with torch.no_grad():  # a random tiny target is nearly uniform; sharpen it so there is something to learn
        target.model.lm_head.weight.mul_(30)
    samples = tiny_samples(32)
    c = TrainConfig(
        family="dflash",
        block_size=4,
        anchors=8,
        max_steps=80,
        batch_size=4,
        lr=1e-2,
        warmup_steps=5,
        eval_every=40,
        ckpt_every=40,
        num_layers=1,
        loss="forward_kl",
        dtype="fp32",
    )
    last = train(target, contract, None, feats, samples[:28], samples[28:], c, tmp_path)
    lines = [m for m in _metrics(tmp_path) if m["split"] == "train"]
    assert len(lines) == 80 and len(lines[0]["acc"]) == 3  # slots 1..B-1
    first, final = sum(m["loss"] for m in lines[:5]) / 5, sum(m["loss"] for m in lines[-5:]) / 5
    assert final < 0.7 * first, (first, final)
    for k in range(3):  # every slot learns (the tiny target's held-out text is unlike its training text)
        assert sum(m["acc"][k] for m in lines[-10:]) / 10 > sum(m["acc"][k] for m in lines[:10]) / 10 + 0.15
    assert last["step"] == 80 and len(last["acc"]) == len(last["chain"]) == 3 and last["anchors"] > 0
    assert last["chain"] == sorted(last["chain"], reverse=True) and last["tau_chain"] == 1 + sum(last["chain"])
    draft = load_checkpoint(tmp_path / "draft", target=target)
    assert draft.contract == contract


def test_dflash_resume_is_bit_exact(tmp_path):
    from tiny import tiny_samples

    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.train.loop import TrainConfig, train

    target, contract, feats = _dflash_setup()
    samples = tiny_samples(24)
    c = TrainConfig(
        family="dflash",
        block_size=4,
        anchors=4,
        max_steps=6,
        batch_size=4,
        warmup_steps=2,
        eval_every=3,
        ckpt_every=3,
        dtype="fp32",
    )
    train(target, contract, None, feats, samples[:20], samples[20:], c, tmp_path / "a")
    train(target, contract, None, feats, samples[:20], samples[20:], c, tmp_path / "b", stop_at=4)  # "killed"
    train(target, contract, None, feats, samples[:20], samples[20:], c, tmp_path / "b", resume=True)
    strip = lambda ms: [{k: v for k, v in m.items() if k != "tok_per_s"} for m in ms]  # noqa: E731
    assert strip(_metrics(tmp_path / "a")) == strip(_metrics(tmp_path / "b"))
    wa = load_checkpoint(tmp_path / "a" / "draft", target=target).state_dict()
    wb = load_checkpoint(tmp_path / "b" / "draft", target=target).state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_reduced_vocabulary_dflash_draft_trains_resumes_and_loads_with_its_map(tmp_path):
    """A vocab map makes the draft's head its own [V_d, H], started from the target's rows; the map travels in
    the contract (its hash) and the checkpoint (d2t/t2d), and resume stays bit-exact."""
    import dataclasses

    from tiny import VOCAB, tiny_samples

    from eaglewire.draft.vocab import VocabMap
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.train.dflash import build_draft
    from eaglewire.train.loop import TrainConfig, train

    target, full, feats = _dflash_setup()
    vmap = VocabMap.from_target_ids(torch.arange(0, VOCAB, 3), VOCAB)
    c = TrainConfig(
        family="dflash",
        block_size=4,
        anchors=4,
        max_steps=6,
        batch_size=4,
        warmup_steps=2,
        eval_every=3,
        ckpt_every=3,
        dtype="fp32",
    )
    contract = dflash_contract(target, full.taps, full.block, vmap)
    assert contract.draft_vocab_size == vmap.draft_vocab_size and contract.vocab_map_sha256 == vmap.sha256()
    assert dataclasses.replace(contract, draft_vocab_size=None, vocab_map_sha256=None) == dataclasses.replace(
        full, draft_vocab_size=None, vocab_map_sha256=None
    )
    start = build_draft(target, contract, vmap, c)
    assert torch.equal(start.lm_head.weight, target.head_rows()[vmap.target_ids])  # the target's rows of the kept ids
    samples = tiny_samples(24)
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "a")
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "b", stop_at=4)
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "b", resume=True)
    a = load_checkpoint(tmp_path / "a" / "draft", target=target)
    b = load_checkpoint(tmp_path / "b" / "draft", target=target)
    assert a.contract == contract and a.reduced and torch.equal(a.d2t, vmap.d2t)
    wa, wb = a.state_dict(), b.state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["lm_head.weight"], start.lm_head.weight)  # its own head trains


def test_cli_captures_dflash_taps_and_trains_a_dflash_draft(tiny_dir, tmp_path):
    """`data capture --family dflash` takes z-lab's five default taps; `train --family dflash` trains on them with
    no vocab map (an EAGLE-3 run without one is refused)."""
    import json

    from test_cli_pipeline import _run
    from typer.testing import CliRunner

    from eaglewire.cli.app import app
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.target.loader import load_target
    from eaglewire.train.dflash import default_taps

    data = tiny_dir / "convs.jsonl"
    _run("data", "capture", "--target", tiny_dir, "--data", data, "--out", tmp_path / "f5", "--family", "dflash")
    taps = json.loads((tmp_path / "f5" / "manifest.json").read_text())["contract"]["taps"]
    assert taps == list(default_taps(8)) and len(taps) == 5
    common = [
        "--target",
        tiny_dir,
        "--features",
        tmp_path / "f5",
        "--max-steps",
        3,
        "--eval-every",
        3,
        "--batch-size",
        4,
        "--heldout-fraction",
        0.2,
    ]
    _run("train", *common, "--family", "dflash", "--block-size", 4, "--anchors", 4, "--out", tmp_path / "d")
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["contract"]["family"] == "dflash" and summary["contract"]["block"]["block_size"] == 4
    assert len(summary["heldout"]["acc"]) == 3 and summary["heldout"]["anchors"] > 0
    draft = load_checkpoint(tmp_path / "d" / "draft", target=load_target(str(tiny_dir)))
    assert draft.contract.taps == tuple(taps)
    r = CliRunner().invoke(app, ["train", *map(str, common), "--out", str(tmp_path / "e")])  # eagle3, no --vocab
    assert r.exit_code == 2 and "vocab map" in r.output


def test_a_block_s_states_ignore_the_context_from_its_anchor_on_and_the_other_blocks():
    """Through the real DFlash draft: changing the taps at positions >= anchor_j, or the tokens of the other
    blocks, leaves block j's states unchanged; changing the taps just before anchor_j does not."""
    from eaglewire.train.dflash import build_draft
    from eaglewire.train.loop import TrainConfig

    target, contract, _ = _dflash_setup(block_size=3)
    draft = build_draft(target, contract, None, TrainConfig(family="dflash", block_size=3, num_layers=2)).eval()
    g = torch.Generator().manual_seed(0)
    T, Bk = 16, 3
    taps = torch.randn(1, T, draft.cfg.num_taps * draft.cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, 200, (1, T), generator=g)
    anchors = torch.tensor([[3, 7, 12]])
    run = lambda taps, ids: draft(
        taps,
        torch.arange(T)[None],
        block_inputs(ids, anchors, Bk, 255),  # noqa: E731
        block_positions(anchors, Bk),
        block_mask(anchors, T, Bk),
    ).detach()
    with torch.no_grad():
        base = run(taps, ids)
        j = 1  # the block anchored at 7: slots 3..5 of the query axis
        later = taps.clone()
        later[:, 7:] += torch.randn(later[:, 7:].shape, generator=g)
        others = ids.clone()
        others[:, [3, 12]] += 1  # the other blocks' anchor tokens
        torch.testing.assert_close(run(later, others)[:, j * Bk : (j + 1) * Bk], base[:, j * Bk : (j + 1) * Bk])
        earlier = taps.clone()
        earlier[:, 6] += 1.0
        assert not torch.allclose(run(earlier, ids)[:, j * Bk : (j + 1) * Bk], base[:, j * Bk : (j + 1) * Bk])


def test_every_family_the_knob_offers_has_a_training_record():
    from eaglewire.train.config import FAMILY_NAMES
    from eaglewire.families import families_with

    assert set(FAMILY_NAMES) == {f.name for f in families_with("objective")}


def test_a_checkpoint_written_before_the_family_knobs_resumes(tmp_path):
    """An EAGLE-3 run checkpointed before `family`, `block_size`, `anchors` and `block_gamma` existed ran at
    their defaults: it resumes; a knob that differs is still refused."""
    import json

    import pytest
    from tiny import tiny_samples

    from eaglewire.capture.features import OnlineFeatures
    from eaglewire.draft.vocab import VocabMap
    from eaglewire.train.loop import TrainConfig, train
    from tiny import build_target

    target = build_target("llama")
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = target.contract((1, 2, 3), vocab_map=vmap)
    feats, samples = OnlineFeatures(target, contract, pad_id=0), tiny_samples(12)
    c = TrainConfig(max_steps=2, batch_size=4, ckpt_every=1, eval_every=2, ttt_steps=1, dtype="fp32")
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path, stop_at=1)
    state = tmp_path / "checkpoints" / "step-000001" / "trainer.json"
    meta = json.loads(state.read_text())
    for k in ("family", "block_size", "anchors", "block_gamma"):
        del meta["config"][k]
    state.write_text(json.dumps(meta))
    assert train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path, resume=True)["step"] == 2
    with pytest.raises(Exception, match="different training settings"):
        train(
            target,
            contract,
            vmap,
            feats,
            samples[:8],
            samples[8:],
            TrainConfig(**{**c.to_dict(), "lr": 0.5, "snapshot_steps": ()}),
            tmp_path,
            resume=True,
        )


def test_a_dflash_draft_started_from_the_target_computes_the_target_layer_s_context_keys():
    """--init-layers-from-target for DFlash: layer 0 is the target layer that reads the last tap, hidden_norm its
    input norm and fc the last tap passed through, so the context keys/values of layer 0 at step 0 are that target
    layer's own (before the q/k norms a Llama target lacks); a fresh draft's are not."""
    import dataclasses

    from eaglewire.train import dflash
    from eaglewire.train.config import TrainConfig

    target, contract, feats = _dflash_setup()
    from tiny import tiny_samples

    fb = feats.batch(tiny_samples(2))
    H = target.text_config.hidden_size
    c = TrainConfig(family="dflash", block_size=4, init_layers_from_target=True)
    for start in (True, False):
        draft = dflash.build_draft(target, contract, None, dataclasses.replace(c, init_layers_from_target=start))
        last = contract.taps[-1]
        layer = target.layers[last]
        with torch.no_grad():
            ctx = draft.context(fb.taps)  # [N, T, H]
            want = layer.self_attn.v_proj(layer.input_layernorm(fb.taps[..., -H:]))
            got = draft.layers[0].self_attn.v_proj(ctx)
        assert torch.allclose(got, want, atol=1e-5) is start


def test_a_dflash_start_from_the_target_refuses_a_layer_of_another_shape():
    import pytest

    from eaglewire.errors import CheckpointError
    from eaglewire.train import dflash
    from eaglewire.train.config import TrainConfig

    target, contract, _ = _dflash_setup()
    draft = dflash.build_draft(target, contract, None, TrainConfig(family="dflash", block_size=4))
    real = target.layer_parameters
    target.layer_parameters = lambda i: {**real(i), "mlp.up_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(CheckpointError, match="cannot start DFlash layer 0"):
        dflash.init_from_target(draft, target)
