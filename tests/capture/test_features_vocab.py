"""Offline features (shards, manifest, tap statistics, resume, refusal) and the vocab map builder."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import build_target, tiny_samples

from eaglewire.capture.features import OfflineFeatures, OnlineFeatures, capture_features
from eaglewire.errors import ContractMismatch
from eaglewire.draft.vocab import (
    VocabMap,
    build_vocab_map,
    count_masked_tokens,
    coverage,
    grow_vocab_map,
    load_vocab,
    save_vocab,
    VocabMapError,
)


@pytest.fixture(scope="module")
def target():
    return build_target("qwen2")


def test_offline_equals_online_and_manifest(tmp_path, target):
    contract = target.contract((1, 2, 4))
    samples = tiny_samples(10)
    manifest = capture_features(
        target, contract, samples, tmp_path, pad_id=0, shard_samples=4, batch_size=3, dtype=torch.float32
    )
    assert [s["samples"] for s in manifest["shards"]] == [4, 4, 2]
    assert manifest["tokens"] == sum(len(s.input_ids) for s in samples)
    stats = manifest["tap_stats"]
    assert stats["taps"] == [1, 2, 4] and len(stats["mean"]) == 3 and len(stats["mean"][0]) == target.hidden_size
    off = OfflineFeatures(tmp_path, contract, pad_id=0)
    on = OnlineFeatures(target, contract, pad_id=0)
    batch = [samples[1], samples[6], samples[9]]
    a, b = off.batch(batch), on.batch(batch)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    real = b.attention_mask.bool()
    torch.testing.assert_close(a.taps[real], b.taps[real], atol=1e-5, rtol=1e-5)  # batching differs
    torch.testing.assert_close(a.final_hidden[real], b.final_hidden[real], atol=1e-5, rtol=1e-5)
    # statistics equal the direct per-channel mean over every real token of the first tap
    first = torch.cat([on.batch([s]).taps[0, :, : target.hidden_size] for s in samples])
    torch.testing.assert_close(torch.tensor(stats["mean"][0]), first.mean(0), atol=1e-4, rtol=1e-4)


def test_killed_capture_resumes_without_recomputing(tmp_path, target):
    contract = target.contract((1, 2, 4))
    samples = tiny_samples(10)

    def die_after_first(k, n, tokens):
        if k == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture_features(target, contract, samples, tmp_path, pad_id=0, shard_samples=4, on_shard=die_after_first)
    first = (tmp_path / "shard-00000.safetensors").stat().st_mtime_ns
    assert not (tmp_path / "manifest.json").exists() and not list(tmp_path.glob(".*tmp*"))
    capture_features(target, contract, samples, tmp_path, pad_id=0, shard_samples=4)
    assert (tmp_path / "shard-00000.safetensors").stat().st_mtime_ns == first  # reused, not recomputed
    assert len(OfflineFeatures(tmp_path, contract, pad_id=0).sample_ids()) == 10


def test_shards_for_another_contract_refused(tmp_path, target):
    samples = tiny_samples(4)
    capture_features(target, target.contract((1, 2, 4)), samples, tmp_path, pad_id=0)
    other = target.contract((0, 2, 4))
    with pytest.raises(ContractMismatch, match="taps"):
        OfflineFeatures(tmp_path, other, pad_id=0)
    with pytest.raises(ContractMismatch):
        capture_features(target, other, samples, tmp_path, pad_id=0)
    # the vocab map is chosen after capture: a contract that differs only there is accepted
    vmap = VocabMap.from_target_ids(torch.arange(10), 256)
    OfflineFeatures(tmp_path, target.contract((1, 2, 4), vocab_map=vmap), pad_id=0)


def test_vocab_build_ties_by_id_and_ascending(tmp_path):
    from eaglewire.data.samples import Sample

    s = Sample("a", torch.tensor([5, 9, 9, 7, 3, 3, 8]), torch.tensor([1, 1, 1, 1, 1, 1, 0]))
    counts = count_masked_tokens([s], 16)
    assert counts[9] == 2 and counts[3] == 2 and counts[8] == 0  # 8 is not trained on
    vm = build_vocab_map(counts, 3)  # 3 and 9 (count 2), then 5 beats 7 on the tie by lower id
    assert vm.target_ids.tolist() == [3, 5, 9] and vm.d2t.tolist() == [3, 4, 7]
    assert coverage(vm, counts) == pytest.approx(5 / 6)
    save_vocab(tmp_path / "v.safetensors", vm, counts, {"note": "x"})
    vm2, counts2, meta = load_vocab(tmp_path / "v.safetensors")
    assert torch.equal(vm2.d2t, vm.d2t) and meta == {"note": "x"} and torch.equal(counts2, counts)
    with pytest.raises(VocabMapError, match="out of range"):
        build_vocab_map(counts, 0)


def test_grown_vocab_keeps_every_warm_start_id_and_adds_the_most_frequent():
    keep = VocabMap.from_target_ids(torch.tensor([2, 11]), 16)  # 11 is never seen in the new data: kept anyway
    counts = torch.zeros(16, dtype=torch.int64)
    counts[[2, 4, 6, 9]] = torch.tensor([50, 3, 7, 3])
    grown = grow_vocab_map(keep, counts, 5)  # 2 and 11 kept; then 6 (count 7); 4 and 9 tie (3), so V_d 5 takes 4 then 9
    assert grown.target_ids.tolist() == [2, 4, 6, 9, 11] and grown.draft_vocab_size == 5
    assert grow_vocab_map(keep, counts, 4).target_ids.tolist() == [2, 4, 6, 11]  # the 4/9 tie: the lower id
    assert grow_vocab_map(keep, counts, 2).target_ids.tolist() == [2, 11]
    with pytest.raises(VocabMapError, match="at least the warm start"):
        grow_vocab_map(keep, counts, 1)


def test_vocab_file_tamper_detected(tmp_path):
    from safetensors.torch import load_file, save_file

    vm = VocabMap.from_target_ids(torch.tensor([1, 4, 6]), 8)
    save_vocab(tmp_path / "v.safetensors", vm, torch.ones(8, dtype=torch.long), {})
    t = load_file(str(tmp_path / "v.safetensors"))
    t["d2t"] = torch.tensor([1, 3, 5])  # still valid, but another map
    t["t2d"] = torch.zeros(8, dtype=torch.bool)
    t["t2d"][[1, 4, 7]] = True
    from safetensors import safe_open

    with safe_open(str(tmp_path / "v.safetensors"), framework="pt") as f:
        md = f.metadata()
    save_file(t, str(tmp_path / "v.safetensors"), metadata=md)
    with pytest.raises(VocabMapError, match="recorded hash"):
        load_vocab(tmp_path / "v.safetensors")
    json.dumps(md)


def test_heldout_split_keeps_a_conversations_turns_together():
    """With --split-turns every turn is a sample (`conv#j`): all turns of one conversation land on the same
    side (a held-out answer must not be trained on through its sibling turns); `conv#0` and non-split
    ids keep the side they always had."""
    from eaglewire.data.samples import Sample, is_held_out, split_heldout

    one = torch.tensor([1])
    samples = [Sample(f"c{i}#{j}", one, one) for i in range(200) for j in range(3)] + [Sample("plain", one, one)]
    train, held = split_heldout(samples, 0.3)
    assert held and train and len(train) + len(held) == len(samples)
    sides = {}
    for s, side in [(s, "held") for s in held] + [(s, "train") for s in train]:
        sides.setdefault(s.id.rsplit("#", 1)[0], set()).add(side)
    assert all(len(v) == 1 for v in sides.values())
    assert all(is_held_out(s.id, 0.3) for s in held if s.id.endswith("#0"))
    assert ("plain" in {s.id for s in held}) == is_held_out("plain", 0.3)


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 63), min_size=1, max_size=64))
def test_draft_index_inverts_d2t(kept):
    """draft_index(t2d)[i + d2t[i]] == i for every draft id, -1 on every id the map drops."""
    from eaglewire.draft.vocab import draft_index

    vmap = VocabMap.from_target_ids(torch.tensor(sorted(kept)), 64)
    idx = draft_index(vmap.t2d)
    assert idx[vmap.target_ids].tolist() == list(range(vmap.draft_vocab_size))
    assert (idx[~vmap.t2d] == -1).all()
