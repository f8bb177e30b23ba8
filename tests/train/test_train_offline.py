"""Offline training reads the draft's few target tensors by name from the target's safetensors files (the
model stays a meta skeleton) and trains bit-identically to training with the whole target loaded."""

import json

import pytest
import torch
from tiny import tiny_samples
from transformers import LlamaConfig, LlamaForCausalLM

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.capture.features import OfflineFeatures, capture_features, captured_taps
from eaglewire.errors import ContractMismatch
from eaglewire.target.loader import load_target
from eaglewire.target.weights import load_target_weights
from eaglewire.train.loop import TrainConfig, train
from eaglewire.draft.vocab import VocabMap

TAPS = (1, 2, 3)


def _target_dir(tmp_path, tied: bool):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a random tiny target is nearly uniform; sharpen it so the draft has something to learn
        model.lm_head.weight.mul_(30)
    model.save_pretrained(tmp_path / "target")
    return str(tmp_path / "target")


def _strip(path):
    return [{k: v for k, v in json.loads(l).items() if k != "tok_per_s"} for l in path.read_text().splitlines()]


@pytest.mark.parametrize("tied", [False, True])
def test_offline_training_from_weight_files_equals_loaded_target(tmp_path, tied):
    spec = _target_dir(tmp_path, tied)
    full, lean = load_target(spec, with_tokenizer=False), load_target_weights(spec, with_tokenizer=False)
    assert all(p.is_meta for p in lean.model.parameters())  # nothing of the model is in memory
    assert lean.identity == full.identity
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = full.contract(TAPS, vocab_map=vmap)
    samples = tiny_samples(24)
    capture_features(full, contract, samples, tmp_path / "feat", pad_id=0, shard_samples=8)
    assert captured_taps(tmp_path / "feat") == TAPS
    assert lean.contract(captured_taps(tmp_path / "feat"), vocab_map=vmap) == contract
    # two draft layers started from the target's top layers: the layer tensors are read by name too
    c = TrainConfig(
        max_steps=6,
        batch_size=4,
        warmup_steps=2,
        eval_every=3,
        ckpt_every=3,
        ttt_steps=2,
        num_layers=2,
        init_layers_from_target=True,
        dtype="fp32",
    )
    for name, tgt in (("full", full), ("lean", lean)):
        feats = OfflineFeatures(tmp_path / "feat", tgt.contract(TAPS, vocab_map=vmap), pad_id=0)
        assert feats.stores_target_top1
        kw = dict(stop_at=4) if name == "lean" else {}  # the lean run is also killed and resumed
        train(tgt, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / name, **kw)
        if name == "lean":
            train(tgt, contract, vmap, feats, samples[:20], samples[20:], c, tmp_path / name, resume=True)
    assert _strip(tmp_path / "full" / "metrics.jsonl") == _strip(tmp_path / "lean" / "metrics.jsonl")
    wa = load_checkpoint(tmp_path / "full" / "draft", target=full).state_dict()
    wb = load_checkpoint(tmp_path / "lean" / "draft", target=lean).state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_head_rows_read_in_chunks_equal_the_loaded_head(tmp_path, monkeypatch):
    import eaglewire.target.weights as weights

    monkeypatch.setattr(weights, "_HEAD_CHUNK_ROWS", 7)  # many chunks, ids across their edges, any order
    spec = _target_dir(tmp_path, tied=False)
    full, lean = load_target(spec, with_tokenizer=False), load_target_weights(spec, with_tokenizer=False)
    ids = torch.tensor([255, 0, 6, 7, 8, 13, 14, 100, 3])
    assert torch.equal(lean.head_rows(ids), full.head_rows(ids))
    assert torch.equal(lean.head_rows(), full.head_rows())
    assert torch.equal(lean.final_norm_weight(), full.final_norm_weight())


def test_features_of_another_target_or_taps_refused_without_loading_it(tmp_path):
    spec = _target_dir(tmp_path, tied=False)
    full = load_target(spec, with_tokenizer=False)
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    capture_features(full, full.contract(TAPS), tiny_samples(8), tmp_path / "feat", pad_id=0)
    with pytest.raises(ContractMismatch, match=r"(?s)taps \[2, 3, 4\].*taps \[1, 2, 3\]"):
        captured_taps(tmp_path / "feat", (2, 3, 4))
    other = tmp_path / "other"
    torch.manual_seed(1)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(other)
    lean = load_target_weights(str(other), with_tokenizer=False)
    with pytest.raises(ContractMismatch, match="config_sha256"):
        OfflineFeatures(tmp_path / "feat", lean.contract(TAPS, vocab_map=vmap), pad_id=0)
