"""TTT training: masks, learning, bit-exact resume, and DDP (2 gloo processes) == one process."""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from tiny import build_target, tiny_samples

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.capture.features import OnlineFeatures
from eaglewire.train.dist import DistInfo
from eaglewire.train.loop import TrainConfig, lr_at, train
from eaglewire.train.ttt import shift_left, ttt_attention_mask
from eaglewire.draft.vocab import VocabMap

TAPS = (1, 2, 3)


def _setup(arch="llama"):
    target = build_target(arch)
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)  # half the vocab
    contract = target.contract(TAPS, vocab_map=vmap)
    return target, vmap, contract, OnlineFeatures(target, contract, pad_id=0)


def test_ttt_mask_and_shift():
    m = ttt_attention_mask(3, 2)[0, 0]
    assert m.shape == (3, 9)
    assert m[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert m[:, 3:6].tolist() == m[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert ttt_attention_mask(3, 0) is None
    assert shift_left(torch.tensor([[1, 2, 3, 4]]), 2).tolist() == [[3, 4, 0, 0]]


def test_lr_schedule():
    c = TrainConfig(max_steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, c) == pytest.approx(0.1) and lr_at(9, c) == pytest.approx(1.0)
    assert lr_at(100, c) == pytest.approx(0.1) and lr_at(55, c) == pytest.approx(0.55)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_training_learns_and_writes_checkpoint(tmp_path, optimizer):
    target, vmap, contract, feats = _setup()
    with torch.no_grad():  # a random tiny target is nearly uniform; sharpen it so there is something to learn
        target.model.lm_head.weight.mul_(30)
    samples = tiny_samples(32)
    c = TrainConfig(
        max_steps=40,
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        eval_every=20,
        ckpt_every=20,
        ttt_steps=3,
        loss="forward_kl",
        optimizer=optimizer,
    )
    last = train(target, contract, vmap, feats, samples[:28], samples[28:], c, tmp_path)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_lines = [l for l in lines if l["split"] == "train"]
    assert len(train_lines) == 40 and len(train_lines[0]["acc"]) == 3
    first, final = sum(l["loss"] for l in train_lines[:5]) / 5, sum(l["loss"] for l in train_lines[-5:]) / 5
    assert final < 0.7 * first, (first, final)
    acc0 = sum(l["acc"][0] for l in train_lines[:5]) / 5
    assert sum(l["acc"][0] for l in train_lines[-5:]) / 5 > acc0 + 0.2
    assert last["split"] == "heldout" and last["step"] == 40 and len(last["acc"]) == 3
    draft = load_checkpoint(tmp_path / "draft", target=target)
    assert draft.contract == contract


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_is_bit_exact(tmp_path, optimizer):
    target, vmap, contract, feats = _setup()
    samples = tiny_samples(24)
    c = TrainConfig(
        max_steps=6, batch_size=4, warmup_steps=2, eval_every=3, ckpt_every=3, ttt_steps=2, optimizer=optimizer
    )
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "a")
    train(
        target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "b", stop_at=4
    )  # "killed" after step 4
    train(target, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / "b", resume=True)
    a = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    strip = lambda ls: [{k: v for k, v in json.loads(l).items() if k != "tok_per_s"} for l in ls]  # noqa: E731
    assert strip(a) == strip(b)
    wa = load_checkpoint(tmp_path / "a" / "draft", target=target).state_dict()
    wb = load_checkpoint(tmp_path / "b" / "draft", target=target).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_muon_takes_the_hidden_matrices_and_adamw_the_head_and_norms():
    from eaglewire.train.loop import build_draft
    from eaglewire.train.optim import Optimizers, build_optimizer

    target, vmap, contract, _ = _setup()
    draft = build_draft(target, contract, vmap, TrainConfig())
    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    opt = build_optimizer(named, "muon", 1e-3, (0.9, 0.95), 0.0)
    assert isinstance(opt, Optimizers)
    (muon, muon_at), (adamw, adamw_at) = opt.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert sorted(muon_at + adamw_at) == list(range(len(named)))  # every weight, once
    on_muon = {named[i][0] for i in muon_at}
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= on_muon
    assert all(named[i][1].ndim == 1 or named[i][0].startswith("lm_head") for i in adamw_at)
    assert any(named[i][0] == "lm_head.weight" for i in adamw_at)


def test_training_the_body_keeps_the_head_as_it_started(tmp_path):
    """--train-only body: every weight but the head learns; the head stays the target's rows it started as."""
    from eaglewire.train.loop import build_draft

    target, vmap, contract, feats = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(
        max_steps=3,
        batch_size=4,
        warmup_steps=1,
        eval_every=3,
        ckpt_every=3,
        ttt_steps=2,
        train_only="body",
        dtype="fp32",
    )
    start = build_draft(target, contract, vmap, c).state_dict()
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path)
    end = load_checkpoint(tmp_path / "draft", target=target).state_dict()
    assert torch.equal(end["lm_head.weight"], start["lm_head.weight"])
    assert not torch.equal(end["fc.weight"], start["fc.weight"])


def test_resume_with_other_settings_refused(tmp_path):
    target, vmap, contract, feats = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(max_steps=2, batch_size=4, ckpt_every=1, eval_every=2, ttt_steps=1)
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path)
    with pytest.raises(Exception, match="different training settings"):
        train(
            target,
            contract,
            vmap,
            feats,
            samples[:8],
            samples[8:],
            TrainConfig(max_steps=3, batch_size=4, ckpt_every=1, eval_every=2, ttt_steps=1, lr=0.5),
            tmp_path,
            resume=True,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    from eaglewire.train.dist import setup, teardown

    info = setup()
    target, vmap, contract, feats = _setup()
    samples = tiny_samples(16)
    # fp32 on every CPU: the equality below is exact arithmetic; bf16 autocast (on CPUs with native bf16)
    # rounds each rank's half-batch differently from the whole batch
    c = TrainConfig(max_steps=2, batch_size=2, warmup_steps=1, eval_every=2, ckpt_every=2, ttt_steps=2, dtype="fp32")
    train(target, contract, vmap, feats, samples[:12], samples[12:], c, out, info)
    teardown(info)


def test_ddp_two_processes_equal_single_process_global_batch(tmp_path):
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path / "ddp")), nprocs=2, join=True)
    target, vmap, contract, feats = _setup()
    samples = tiny_samples(16)
    c = TrainConfig(max_steps=2, batch_size=4, warmup_steps=1, eval_every=2, ckpt_every=2, ttt_steps=2, dtype="fp32")
    # one process, global batch 4 = 2 ranks x 2; DistInfo(world_size=1) sees the same global batches
    train(target, contract, vmap, feats, samples[:12], samples[12:], c, tmp_path / "one", DistInfo())
    wd = load_checkpoint(tmp_path / "ddp" / "draft", target=target).state_dict()
    w1 = load_checkpoint(tmp_path / "one" / "draft", target=target).state_dict()
    for k in w1:
        torch.testing.assert_close(wd[k], w1[k], atol=2e-6, rtol=1e-5, msg=k)
    from eaglewire.train.loop import build_draft

    init = build_draft(target, contract, vmap, c).state_dict()
    assert float((w1["fc.weight"] - init["fc.weight"]).abs().max()) > 1e-4  # training really moved them
