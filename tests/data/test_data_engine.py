"""The data engine's parts: rolling-pool regeneration, [start, start+limit) files, CPU-feature-driven
dtype, stored target top-1 and the sliced head, warm start, benchmark questions spread over categories."""

import dataclasses
import json
import threading
import time

import pytest
import torch
from test_regenerate import S, EchoGenerator, source  # noqa: F401 (fixture)
from tiny import build_target, tiny_samples

import eaglewire.train.warm as train_warm
from eaglewire import hw
from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.capture.features import OfflineFeatures, OnlineFeatures, capture_features
from eaglewire.data.regenerate import Reply, read_done, regen_meta, regenerate
from eaglewire.errors import CheckpointError, EaglewireError
from eaglewire.train.loop import TrainConfig, build_draft, feature_space, train
from eaglewire.train.ttt import TTTModel, round_starts, shift_left, simulate_rounds
from eaglewire.draft.vocab import VocabMap


class ChatEcho(EchoGenerator):
    """A serving engine's shape: one request at a time from many threads, replies of varying latency."""

    def __init__(self, die_after=None):
        super().__init__(die_after)
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()

    def chat_one(self, messages, seed):
        with self.lock:
            self.calls += 1
            if self.die_after is not None and self.calls > self.die_after:
                raise KeyboardInterrupt
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        time.sleep(0.001 * (len(messages[-1]["content"]) % 5))
        with self.lock:
            self.in_flight -= 1
        return Reply(text=f"answer {len(messages)} to {messages[-1]['content']}", new_tokens=3, finish="stop")


def _by_id(records):
    return sorted(records, key=lambda r: r["id"])


def test_rolling_pool_equals_batches_and_keeps_the_engine_full(tmp_path, source):  # noqa: F811
    batch, pool = tmp_path / "b.jsonl.gz", tmp_path / "p.jsonl.gz"
    regenerate(source, batch, EchoGenerator(), S, limit=100)
    gen = ChatEcho()
    stats = regenerate(source, pool, gen, S, limit=100)
    assert _by_id(read_done(pool)) == _by_id(read_done(batch))  # same content, completion order
    assert stats.conversations == 21 and stats.skipped_long == 1 and stats.turns == 40
    assert gen.peak == S.batch_size  # as many requests in flight as asked for


def test_rolling_pool_kill_and_resume_loses_nothing(tmp_path, source):  # noqa: F811
    ref, out = tmp_path / "ref.jsonl.gz", tmp_path / "r.jsonl.gz"
    regenerate(source, ref, ChatEcho(), S, limit=100)
    with pytest.raises(KeyboardInterrupt):
        regenerate(source, out, ChatEcho(die_after=20), S, limit=100)
    assert 0 < len(read_done(out)) < 21
    regenerate(source, out, ChatEcho(), S, limit=100)
    got = read_done(out)
    assert len(got) == len({r["id"] for r in got}) == 21 and _by_id(got) == _by_id(read_done(ref))


def test_start_offset_selects_a_range_and_is_part_of_the_identity(tmp_path, source):  # noqa: F811
    out = tmp_path / "r.jsonl.gz"
    regenerate(source, out, ChatEcho(), S, limit=5, start=10)
    assert sorted(r["id"] for r in read_done(out)) == sorted(f"c{i}" for i in range(10, 15))
    meta = json.loads((tmp_path / "r.jsonl.gz.meta.json").read_text())
    assert meta["start"] == 10 and "start" not in regen_meta(source, S, ChatEcho())
    with pytest.raises(EaglewireError, match="other settings"):
        regenerate(source, out, ChatEcho(), S, limit=5)  # the same file cannot silently become [0, 5)


def test_autocast_dtype_follows_the_cpu(monkeypatch):
    for cap in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "EAGLEWIRE_NO_BF16"):  # whatever the caller's shell set
        monkeypatch.delenv(cap, raising=False)
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not hw.native_bf16()
    assert hw.autocast_dtype("cpu", "auto") is None and hw.autocast_dtype("cpu", "fp32") is None
    with pytest.raises(EaglewireError, match="without native bf16"):
        hw.autocast_dtype("cpu", "bf16")
    assert hw.autocast_dtype("cuda:0", "auto") is torch.bfloat16
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hw.native_bf16() and hw.autocast_dtype("cpu", "auto") is torch.bfloat16
    for cap, native in (("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True), ("AVX512_CORE_AMX", True)):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)  # oneDNN capped below bf16 cannot pack bf16 weights
        assert hw.native_bf16() is native, cap
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")  # oneDNN's older spelling
    assert not hw.native_bf16()
    monkeypatch.delenv("DNNL_MAX_CPU_ISA")
    monkeypatch.setenv("EAGLEWIRE_NO_BF16", "1")
    assert hw.autocast_dtype("cpu", "auto") is None
    with pytest.raises(ValueError):
        hw.autocast_dtype("cpu", "fp16")


def _setup():
    target = build_target("llama")
    with torch.no_grad():
        target.model.lm_head.weight.mul_(30)  # a peaked target, so top-1 and the vocab mask matter
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    return target, vmap, target.contract((1, 2, 3), vocab_map=vmap)


def test_stored_top1_and_sliced_head_give_the_full_head_loss(tmp_path):
    target, vmap, contract = _setup()
    samples = tiny_samples(6)
    capture_features(target, contract, samples, tmp_path, pad_id=0, dtype=torch.float32)
    off, on = OfflineFeatures(tmp_path, contract, pad_id=0), OnlineFeatures(target, contract, pad_id=0)
    a, b = off.batch(samples[:3]), on.batch(samples[:3])
    real = b.attention_mask.bool()
    head = target.model.get_output_embeddings().weight
    assert torch.equal(a.target_top1[real], (b.final_hidden @ head.T).argmax(-1)[real])
    assert b.target_top1 is None  # online: computed by the loss from the full head
    draft = build_draft(target, contract, vmap, TrainConfig(ttt_steps=3))
    model = TTTModel(draft, head.detach(), steps=3, decay=0.8)
    (la, sa), (lb, sb) = model(a), model(b)
    # the old loss, written out: full [B, T, V] logits, columns of the draft vocab
    assert model.draft_head.shape == (128, target.hidden_size)
    torch.testing.assert_close(model.draft_head, head[vmap.target_ids])
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    assert sa.counts == sb.counts and sa.correct == sb.correct


def test_bf16_storage_keeps_training_signal(tmp_path):
    target, vmap, contract = _setup()
    samples = tiny_samples(6)
    capture_features(target, contract, samples, tmp_path / "f32", pad_id=0, dtype=torch.float32)
    capture_features(target, contract, samples, tmp_path / "bf16", pad_id=0)  # the default
    a = OfflineFeatures(tmp_path / "f32", contract, pad_id=0).batch(samples[:4])
    b = OfflineFeatures(tmp_path / "bf16", contract, pad_id=0).batch(samples[:4])
    assert torch.equal(a.target_top1, b.target_top1)  # argmax taken in fp32 before storage
    torch.testing.assert_close(b.taps, a.taps, atol=0.05, rtol=0.01)
    head = target.model.get_output_embeddings().weight.detach()
    draft = build_draft(target, contract, vmap, TrainConfig(ttt_steps=2))
    model = TTTModel(draft, head, steps=2, decay=0.8)
    la, lb = model(a)[0].detach(), model(b)[0].detach()
    assert abs(float(la) - float(lb)) < 0.01 * float(la)


def test_warm_start_copies_weights_and_remaps_the_head(tmp_path):
    target, vmap, contract = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(max_steps=3, batch_size=4, warmup_steps=1, eval_every=3, ckpt_every=3, ttt_steps=1, dtype="fp32")
    train(
        target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:8], samples[8:], c, tmp_path / "a"
    )
    first = load_checkpoint(tmp_path / "a" / "draft", target=target)
    other = VocabMap.from_target_ids(torch.arange(0, 192, 1)[::3].sort().values, 256)  # overlaps vmap on multiples of 6
    c2 = TrainConfig(init_from=str(tmp_path / "a" / "draft"), ttt_steps=1)
    warm = build_draft(target, target.contract((1, 2, 3), vocab_map=other), other, c2)
    ws, fs = warm.state_dict(), first.state_dict()
    assert torch.equal(ws["fc.weight"], fs["fc.weight"].float())
    assert torch.equal(ws["layers.0.mlp.down_proj.weight"], fs["layers.0.mlp.down_proj.weight"].float())
    head = target.model.get_output_embeddings().weight.detach()
    ids = other.target_ids
    even = ids % 2 == 0  # vmap keeps the even ids, in order
    mapped = train_warm.mapped_head_rows(head[ids], even, fs["lm_head.weight"][ids[even] // 2])
    for i, t in enumerate(ids.tolist()):
        want = fs["lm_head.weight"][t // 2].float() if t % 2 == 0 else mapped[int((~even[:i]).sum())]
        torch.testing.assert_close(ws["lm_head.weight"][i], want, rtol=0, atol=1e-6, msg=str(t))
    with pytest.raises(CheckpointError, match="other target boundaries"):
        build_draft(target, target.contract((1, 2, 4), vocab_map=vmap), vmap, c2)


def test_norms_knob_names_the_flags_and_a_warm_start_keeps_its_own(tmp_path):
    """--norms picks a preset; auto is NEW_DRAFT_NORMS for a new draft and the source's flags for a warm start;
    a warm start asked for other flags is refused (its weights compute another function under them)."""
    from eaglewire.norms import NORM_PRESETS
    from eaglewire.train.config import NEW_DRAFT_NORMS, draft_norms

    target, vmap, _ = _setup()
    assert draft_norms(TrainConfig()) == NORM_PRESETS[NEW_DRAFT_NORMS]
    assert draft_norms(TrainConfig(norms="eagle3.1")) == NORM_PRESETS["eagle3.1"] != NORM_PRESETS["eagle3"]
    c = TrainConfig(
        max_steps=1,
        batch_size=4,
        warmup_steps=1,
        eval_every=1,
        ckpt_every=1,
        ttt_steps=1,
        dtype="fp32",
        norms="speculators",
    )
    contract = target.contract((1, 2, 3), vocab_map=vmap, norm=draft_norms(c))
    samples = tiny_samples(8)
    train(
        target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:4], samples[4:], c, tmp_path / "a"
    )
    src = load_checkpoint(tmp_path / "a" / "draft", target=target)
    assert src.cfg.norm == NORM_PRESETS["speculators"] and src.input_norm is not None
    auto = TrainConfig(init_from=str(tmp_path / "a" / "draft"))
    assert draft_norms(auto) == NORM_PRESETS["speculators"]
    warm = build_draft(target, target.contract((1, 2, 3), vocab_map=vmap, norm=draft_norms(auto)), vmap, auto)
    assert torch.equal(warm.state_dict()["input_norm.weight"], src.state_dict()["input_norm.weight"].float())
    other = dataclasses.replace(auto, norms="eagle3.1")
    with pytest.raises(CheckpointError, match="other norm flags") as err:
        build_draft(target, target.contract((1, 2, 3), vocab_map=vmap, norm=draft_norms(other)), vmap, other)
    assert "--norms speculators" in err.value.fix


def test_training_only_new_head_rows_leaves_the_warm_start_exactly_as_it_was(tmp_path):
    """--train-only new_head_rows: a grown vocab's new rows learn; every weight the warm start had (its head
    rows, the layer, fc, norms) is bit-identical after training. --train-only head moves the head alone."""
    target, vmap, contract = _setup()
    samples = tiny_samples(12)
    feats = OnlineFeatures(target, contract, pad_id=0)
    c = TrainConfig(max_steps=2, batch_size=4, warmup_steps=1, eval_every=2, ckpt_every=2, ttt_steps=1, dtype="fp32")
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path / "a")
    src = load_checkpoint(tmp_path / "a" / "draft", target=target).state_dict()
    grown = VocabMap.from_target_ids(torch.arange(0, 192), 256)  # vmap's evens below 192, and the odds
    gc = target.contract(tuple(contract.taps), vocab_map=grown)
    init = dataclasses.replace(c, max_steps=4, lr=1e-2, init_from=str(tmp_path / "a" / "draft"))
    for only in ("new_head_rows", "head"):
        cfg = dataclasses.replace(init, train_only=only)
        start = build_draft(target, gc, grown, cfg).state_dict()
        train(target, gc, grown, feats, samples[:8], samples[8:], cfg, tmp_path / only)
        out = load_checkpoint(tmp_path / only / "draft", target=target).state_dict()
        for k, v in out.items():
            if k != "lm_head.weight":
                assert torch.equal(v, start[k].to(v.dtype)), (only, k)
        old, new = grown.target_ids % 2 == 0, grown.target_ids % 2 == 1
        moved = (out["lm_head.weight"] - start["lm_head.weight"]).abs().sum(-1) > 0  # [V_d]
        assert moved[new].all(), only
        if only == "new_head_rows":
            kept_rows = src["lm_head.weight"][grown.target_ids[old] // 2]  # vmap holds the even ids in order
            assert torch.equal(out["lm_head.weight"][old], kept_rows), "a kept row moved"
        else:
            assert moved[old].any()
    with pytest.raises(ValueError, match="adds no id"):
        build_and_freeze = dataclasses.replace(init, train_only="new_head_rows")
        train(target, contract, vmap, feats, samples[:8], samples[8:], build_and_freeze, tmp_path / "none")


def test_mapped_head_rows_recover_an_affine_image_of_the_target_head():
    """A trained head that is exactly an affine image of the target's rows on the kept ids gives the new ids
    the same image (what warm_start's grown rows rely on), also when fewer rows than H + 1 are kept."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(300, 16, generator=g)  # [V_d, H] the target's head rows
    A, b = torch.randn(16, 16, generator=g), torch.randn(16, generator=g)
    kept = torch.rand(300, generator=g) < 0.5
    out = train_warm.mapped_head_rows(rows, kept, rows[kept] @ A + b)
    torch.testing.assert_close(out, rows[~kept] @ A + b, atol=1e-4, rtol=1e-4)
    few = torch.zeros(300, dtype=torch.bool)
    few[:8] = True  # underdetermined: still finite, and exact on the kept rows' span
    out = train_warm.mapped_head_rows(rows, few, rows[few] @ A + b)
    assert out.shape == (292, 16) and torch.isfinite(out).all()


def test_a_warm_start_grows_layers_that_start_as_the_identity(tmp_path, monkeypatch):
    target, vmap, contract = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(max_steps=3, batch_size=4, warmup_steps=1, eval_every=3, ckpt_every=3, ttt_steps=1, dtype="fp32")
    train(
        target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:8], samples[8:], c, tmp_path / "a"
    )
    one = load_checkpoint(tmp_path / "a" / "draft", target=target).float()
    grow = TrainConfig(init_from=str(tmp_path / "a" / "draft"), num_layers=3)
    batch = OnlineFeatures(target, contract, pad_id=0).batch(samples[:2])
    monkeypatch.setattr(train_warm, "GROWN_OUT_SCALE", 0.0)  # the structure: zero output projections = the identity
    exact = build_draft(target, contract, vmap, grow)
    with torch.no_grad():
        a, b = one(batch.input_ids, batch.taps), exact(batch.input_ids, batch.taps)
    torch.testing.assert_close(b.logits, a.logits)
    torch.testing.assert_close(b.hidden, a.hidden)
    monkeypatch.undo()
    grown = build_draft(target, contract, vmap, grow)  # the default: near the identity, and learning
    assert grown.cfg.num_layers == 3
    # ... and every weight of theirs learns from the first step (exactly zero output projections would leave
    # q/k/v and the MLP's inputs without a gradient, hence without an Adam update)
    loss = grown(batch.input_ids, batch.taps).logits.square().mean()
    loss.backward()
    for i in (1, 2):
        for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj", "self_attn.o_proj", "mlp.down_proj"):
            assert grown.layers[i].get_submodule(name).weight.grad.abs().sum() > 0, (i, name)
    # shrinking is no warm start: which layer would be dropped is not ours to guess
    train(
        target,
        contract,
        vmap,
        OnlineFeatures(target, contract, pad_id=0),
        samples[:8],
        samples[8:],
        TrainConfig(**{**c.to_dict(), "num_layers": 2}),
        tmp_path / "b",
    )
    with pytest.raises(CheckpointError, match="cannot warm-start"):
        build_draft(target, contract, vmap, TrainConfig(init_from=str(tmp_path / "b" / "draft"), num_layers=1))


def test_bench_questions_spread_over_categories(tmp_path):
    from eaglewire.serve.bench import spread_over_categories

    rows = [{"question_id": i, "category": ["a", "b", "c"][i // 4], "turns": [f"q{i}"]} for i in range(12)]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [c.id for c in spread_over_categories(str(path), 5)] == ["0", "4", "8", "1", "5"]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({"question_id": i, "turns": [f"q{i}"]}) for i in range(5)))
    assert [c.id for c in spread_over_categories(str(plain), 3)] == ["0", "1", "2"]
    mt = spread_over_categories("mtbench", 8)
    assert len({c.id for c in mt}) == 8 and [int(c.id) for c in mt] == list(range(81, 160, 10))


def test_snapshots_are_kept_at_the_asked_steps(tmp_path):
    target, vmap, contract = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(
        max_steps=4, batch_size=4, warmup_steps=1, eval_every=4, ckpt_every=4, ttt_steps=1, snapshot_steps=(1, 3)
    )
    train(target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:8], samples[8:], c, tmp_path)
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["step-000001", "step-000003"]
    a = load_checkpoint(tmp_path / "snapshots" / "step-000001", target=target).state_dict()
    b = load_checkpoint(tmp_path / "draft", target=target).state_dict()
    assert not torch.equal(a["fc.weight"], b["fc.weight"])  # a real earlier state, not the final one


def test_layers_start_from_the_targets_top_layers():
    target, vmap, contract = _setup()
    draft = build_draft(target, contract, vmap, TrainConfig(num_layers=2, init_layers_from_target=True))
    top, below = target.layers[-1], target.layers[-2]
    h = draft.cfg.hidden_size
    first, second = draft.layers[0], draft.layers[1]
    assert torch.equal(first.self_attn.q_proj.weight[:, h:], below.self_attn.q_proj.weight)  # hidden half
    assert not torch.equal(first.self_attn.q_proj.weight[:, :h], torch.zeros_like(below.self_attn.q_proj.weight))
    assert torch.equal(first.mlp.up_proj.weight, below.mlp.up_proj.weight)
    assert torch.equal(second.self_attn.o_proj.weight, top.self_attn.o_proj.weight)
    assert torch.equal(second.post_attention_layernorm.weight, top.post_attention_layernorm.weight)
    plain = build_draft(target, contract, vmap, TrainConfig(num_layers=2))
    assert not torch.equal(plain.layers[1].mlp.up_proj.weight, top.mlp.up_proj.weight)


def test_feature_mix_serves_extra_directories_without_id_collisions(tmp_path):
    from eaglewire.capture.features import FeatureMix
    from eaglewire.errors import ContractMismatch

    target, vmap, contract = _setup()
    a, b = tiny_samples(6), tiny_samples(10)[4:]  # ids 4 and 5 are in both: the prefix keeps them apart
    capture_features(target, contract, a, tmp_path / "a", pad_id=0)
    capture_features(target, contract, b, tmp_path / "b", pad_id=0)
    fa, fb = (OfflineFeatures(tmp_path / d, contract, pad_id=0) for d in "ab")
    mix = FeatureMix(fa, [fb])
    extra = mix.samples(1)
    assert [s.id for s in mix.samples(0)] == [s.id for s in fa.samples()]  # the primary's ids (its split) unchanged
    assert all(s.id.startswith("+1/") for s in extra) and {s.id[3:] for s in extra} & {s.id for s in a}
    both = mix.batch([fa.samples()[2], extra[0]])
    alone_a, alone_b = fa.batch([fa.samples()[2]]), fb.batch([fb.samples()[0]])
    n = alone_b.input_ids.shape[1]
    assert torch.equal(both.taps[1, :n], alone_b.taps[0]) and torch.equal(
        both.taps[0, : alone_a.taps.shape[1]], alone_a.taps[0]
    )
    capture_features(target, contract, b, tmp_path / "c", pad_id=0, dtype=torch.float32)
    with pytest.raises(ContractMismatch, match="store_dtype"):
        FeatureMix(fa, [OfflineFeatures(tmp_path / "c", contract, pad_id=0)])


def test_supervising_all_positions_adds_the_prompt_tokens():
    target, vmap, contract = _setup()
    fb = OnlineFeatures(target, contract, pad_id=0).batch(tiny_samples(3))
    model = TTTModel(
        build_draft(target, contract, vmap, TrainConfig(ttt_steps=1)),
        target.model.get_output_embeddings().weight.detach(),
        steps=1,
        decay=0.8,
    )
    answers, everything = model(fb)[1].counts[0], model(fb, all_positions=True)[1].counts[0]
    assert 0 < answers < everything
    assert everything <= int(fb.attention_mask.sum()) - 2 * fb.attention_mask.shape[0]  # no label past the end


def _chain_stats(model, fb, hits):
    """Run the TTT forward with the draft's top-1 forced to `hits` (True: right, False: wrong, None: real)."""
    if hits is None:
        return model(fb)[1]
    real = model._step_loss

    def forced(draft_logits, target_logits):
        loss, hit = real(draft_logits, target_logits)
        return loss, torch.full_like(hit, hits)

    model._step_loss = forced
    return model(fb)[1]


def test_chain_acceptance_counts_all_right_prefixes(tmp_path):
    """Teacher-forced chain acceptance: an always-right draft accepts every anchor except where the target's
    token lies outside the draft vocab (computed independently here), an always-wrong one none, and with one
    TTT step the chain is exactly the top-1 hits."""
    target, vmap, contract = _setup()
    samples = tiny_samples(6)
    head = target.model.get_output_embeddings().weight.detach()
    fb = OnlineFeatures(target, contract, pad_id=0).batch(samples[:4])
    model = TTTModel(build_draft(target, contract, vmap, TrainConfig(ttt_steps=3)), head, steps=3, decay=0.8)
    right = _chain_stats(model, fb, True)
    top1 = (fb.final_hidden @ head.T).argmax(-1)  # [B, T] target's token after each position
    in_vocab, answer = vmap.t2d[top1], fb.loss_mask.bool()
    T = top1.shape[1]
    expect, anchors = [0, 0, 0], 0
    for b in range(top1.shape[0]):
        for t in range(T - 4):
            if all(answer[b, t + 2 + k] for k in range(3)):
                anchors += 1
                for k in range(3):
                    expect[k] += all(in_vocab[b, t + 1 + j] for j in range(k + 1))
    assert right.anchors == anchors > 0
    assert right.chain == expect and expect[0] > expect[2]  # the vocab mask breaks some chains
    assert _chain_stats(model, fb, False).chain == [0, 0, 0]
    one = TTTModel(model.draft, head, steps=1, decay=0.8)
    st = _chain_stats(one, fb, None)
    assert st.chain == st.correct and st.anchors == int(answer[:, 2:].sum())
    three = _chain_stats(model, fb, None)
    assert three.chain[0] >= three.chain[1] >= three.chain[2]


def test_simulate_rounds_walks_as_a_decoder():
    """Rounds start where the previous one ended (anchor + accepted + 1), each answer from its first anchor;
    an always-right k-chain gives tau k+1, an always-wrong one 1."""
    F_, T_ = False, True
    # one answer: rounds at 1 (2 accepted) and 4 (3 accepted); the anchors skipped between are no rounds
    assert simulate_rounds(
        torch.tensor([[F_, T_, T_, T_, T_, T_, F_, F_]]), torch.tensor([[0, 2, 0, 1, 3, 0, 0, 0]])
    ) == (3 + 4, 2)
    # two answers in one row: the walk leaves the first through its tail and restarts at the second's start
    assert simulate_rounds(torch.tensor([[T_, T_, F_, F_, T_, T_, T_]]), torch.tensor([[1, 0, 0, 0, 0, 2, 1]])) == (
        2 + 1 + 3,
        3,
    )
    anchor = torch.ones(2, 12, dtype=torch.bool)
    anchor[:, 9:] = False
    tokens, rounds = simulate_rounds(anchor, torch.full((2, 12), 3))
    assert tokens / rounds == 4 and rounds == 2 * 3  # rounds at 0, 4, 8 in each row
    assert simulate_rounds(anchor, torch.zeros(2, 12, dtype=torch.long)) == (18, 18)


def test_evaluation_walks_rounds_over_the_chains():
    """In eval mode the TTT forward also walks its chains round by round: an always-wrong draft makes a
    round of every anchor (tau 1); an always-right one needs fewer rounds for more tokens per round;
    training skips the walk."""
    target, vmap, contract = _setup()
    fb = OnlineFeatures(target, contract, pad_id=0).batch(tiny_samples(4))
    model = TTTModel(
        build_draft(target, contract, vmap, TrainConfig(ttt_steps=3)),
        target.model.get_output_embeddings().weight.detach(),
        steps=3,
        decay=0.8,
    )
    assert _chain_stats(model, fb, True).rounds == 0  # training mode
    model.eval()
    wrong, right = _chain_stats(model, fb, False), _chain_stats(model, fb, True)
    assert wrong.round_tokens == wrong.rounds == wrong.anchors > 0
    assert 0 < right.rounds < wrong.rounds and right.round_tokens / right.rounds > 1.5


def test_round_weight_reweighs_the_chains_where_rounds_start():
    """Where every chain fails at once, every anchor starts a round; the weighted reduction is the weighted
    mean; in training a weight changes the loss where round starts are a strict subset of the rows."""
    anchor = torch.tensor([[False, True, True, True, False]])
    assert round_starts(anchor, torch.zeros(1, 5, dtype=torch.long)).equal(anchor)
    assert round_starts(anchor, torch.tensor([[0, 1, 0, 0, 0]])).tolist() == [[False, True, False, True, False]]
    target, vmap, contract = _setup()
    fb = OnlineFeatures(target, contract, pad_id=0).batch(tiny_samples(4))
    draft, head = (
        build_draft(target, contract, vmap, TrainConfig(ttt_steps=2)),
        target.model.get_output_embeddings().weight.detach(),
    )
    plain = TTTModel(draft, head, steps=2, decay=0.8)
    weighted = TTTModel(draft, head, steps=2, decay=0.8, round_weight=3.0)
    per_pos = torch.tensor([1.0, 2.0, 4.0])
    assert float(weighted._reduce(per_pos, None)) == pytest.approx(7 / 3)
    assert float(weighted._reduce(per_pos, torch.tensor([1.0, 1.0, 4.0]))) == pytest.approx((1 + 2 + 16) / 6)
    torch.manual_seed(0)
    assert float(plain(fb)[0]) != pytest.approx(float(weighted(fb)[0]), rel=1e-4)
    plain.eval(), weighted.eval()  # evaluation is never weighted
    assert float(plain(fb)[0]) == float(weighted(fb)[0])
    with pytest.raises(ValueError, match="round_weight"):
        TTTModel(draft, head, steps=2, decay=0.8, round_weight=-1)


def test_feature_loss_pulls_the_draft_state_to_the_targets_next_state_everywhere():
    """The feature loss: with every target top-1 outside the draft vocab the distribution loss has no row, and
    the feature term is exactly w (A s_t - h_{t+1})^T G (A s_t - h_{t+1}) averaged over trained rows: the draft's
    step-0 state at t against the target's final-norm state at t + 1 (the one whose head predicts x_{t+2}). It
    trains (gradient reaches the draft), evaluation leaves it out, and `feature_space` of a fresh draft is
    (the centred head's Gram matrix: the mean squared centred logit, the identity map)."""
    target, vmap, contract = _setup()
    fb = OnlineFeatures(target, contract, pad_id=0).batch(tiny_samples(4))
    fb.target_top1 = torch.ones_like(fb.input_ids)  # id 1: odd, outside this half-vocab map
    assert not bool(vmap.t2d[1])
    draft = build_draft(target, contract, vmap, TrainConfig(ttt_steps=1))
    head = target.model.get_output_embeddings().weight.detach()
    assert float(TTTModel(draft, head, steps=1, decay=0.8)(fb)[0]) == 0.0  # no in-vocab row: nothing to learn
    gram, amap = feature_space(draft, target, vmap, "cpu")
    H = gram.shape[0]
    assert torch.allclose(amap, torch.eye(H), atol=1e-3)
    s = torch.randn(5, H)
    logits = s @ head.float().T  # [5, V]
    centred_mse = (logits - logits.mean(-1, keepdim=True)).pow(2).mean(-1)
    assert torch.allclose(((s @ gram) * s).sum(-1), centred_mse, rtol=1e-4)
    rot = torch.linalg.qr(torch.randn(H, H))[0]  # any map: the loss must apply it
    model = TTTModel(draft, head, steps=1, decay=0.8, feature_weight=2.0, feature_space=(gram, rot))
    loss, _ = model(fb, all_positions=True)
    with torch.no_grad():
        normed = draft.step(shift_left(fb.input_ids, 1), draft.fuse(fb.taps)).normed  # [B, T, H]
        rows = (shift_left(fb.attention_mask, 2) > 0).nonzero(as_tuple=True)
        diff = normed[rows] @ rot.T - fb.final_hidden[rows[0], rows[1] + 1]
        want = ((diff @ gram) * diff).sum(-1).mean()
    assert float(loss) == pytest.approx(2.0 * float(want), rel=1e-4)
    loss.backward()
    assert draft.fc.weight.grad is not None and draft.fc.weight.grad.abs().sum() > 0
    model.eval()
    assert float(model(fb)[0]) == 0.0
    with pytest.raises(ValueError, match="feature_weight"):
        TTTModel(draft, head, steps=1, decay=0.8, feature_weight=-1)
    with pytest.raises(ValueError, match="feature_space"):
        TTTModel(draft, head, steps=1, decay=0.8, feature_weight=1.0)
