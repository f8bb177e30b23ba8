"""Native checkpoint: bit-identical round trip, and every corruption refused with the right message."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_draft, build_target

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.norms import NormFlags
from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.draft.vocab import VocabMapError


@pytest.fixture(scope="module")
def target():
    return build_target("llama")


@pytest.fixture()
def saved(tmp_path, target):
    draft, contract = build_draft(target, norm=NormFlags(norm_before_fc=True), num_layers=2)
    path = save_checkpoint(draft, contract, tmp_path / "ckpt")
    return draft, contract, path


def _rewrite(path, fn):
    f = path / "model.safetensors"
    tensors = fn(load_file(str(f)))
    save_file(tensors, str(f), metadata={"format": "eaglewire.draft/1"})


def test_save_load_bit_identical(saved, target):
    draft, contract, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    assert "embed_tokens.weight" not in load_file(str(path / "model.safetensors"))
    loaded = load_checkpoint(path, target=target)
    a, b = draft.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert loaded.contract == contract
    assert json.loads((path / "config.json").read_text())["contract"]["taps"] == [1, 2, 3]


def test_bf16_save_and_saved_embedding(tmp_path, target):
    draft, contract = build_draft(target)
    path = save_checkpoint(draft, contract, tmp_path / "bf16", dtype=torch.bfloat16, save_embedding=True)
    loaded = load_checkpoint(path)  # embedding in the file: no target needed
    assert torch.equal(loaded.fc.weight, draft.fc.weight.to(torch.bfloat16).float())
    assert torch.equal(loaded.embed_tokens.weight, target.embed_tokens.weight.to(torch.bfloat16).float())


def test_renamed_key_refused(saved, target):
    _, _, path = saved
    _rewrite(
        path,
        lambda t: {(k.replace("layers.0.", "midlayer.") if k.startswith("layers.0.") else k): v for k, v in t.items()},
    )
    with pytest.raises(CheckpointError, match="wrong set of tensors") as err:
        load_checkpoint(path, target=target)
    assert "'midlayer.self_attn.q_proj.weight' -> did you mean 'layers.0.self_attn.q_proj.weight'" in str(err.value)


def test_missing_d2t_refused(saved, target):
    _, _, path = saved
    _rewrite(path, lambda t: {k: v for k, v in t.items() if k != "d2t"})
    with pytest.raises(CheckpointError, match=r"missing \['d2t'\]"):
        load_checkpoint(path, target=target)


def test_t2d_sum_mismatch_refused(saved, target):
    _, _, path = saved

    def corrupt(t):
        t["t2d"] = t["t2d"].clone()
        t["t2d"][1] = True  # one more target id than the draft has rows
        return t

    _rewrite(path, corrupt)
    with pytest.raises(VocabMapError, match=r"t2d.sum\(\) must equal the draft vocab size") as err:
        load_checkpoint(path, target=target)
    assert "expected: 128" in str(err.value) and "found:    129" in str(err.value)


def test_wrong_shape_and_dtype_refused(saved, target):
    _, _, path = saved
    _rewrite(path, lambda t: {**t, "fc.weight": t["fc.weight"][:, :64].contiguous()})
    with pytest.raises(CheckpointError, match="'fc.weight' has the wrong shape"):
        load_checkpoint(path, target=target)
    _rewrite(path, lambda t: {**t, "fc.weight": torch.zeros(64, 192, dtype=torch.float16)})
    with pytest.raises(CheckpointError, match="'fc.weight' has the wrong dtype"):
        load_checkpoint(path, target=target)


def test_contract_for_another_target_refused(saved):
    _, _, path = saved
    other = build_target("qwen2")  # same sizes, different config
    with pytest.raises(ContractMismatch, match="target.config_sha256") as err:
        load_checkpoint(path, target=other)
    assert "target.architecture='LlamaForCausalLM'" in str(err.value)


def test_config_contract_disagreement_refused(saved, target):
    _, _, path = saved
    meta = json.loads((path / "config.json").read_text())
    meta["draft"]["num_taps"] = 1
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="'num_taps' disagrees with the wiring contract"):
        load_checkpoint(path, target=target)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weight_refused_by_name(saved, target, value):
    _, _, path = saved
    _rewrite(path, lambda t: {**t, "norm.weight": torch.full_like(t["norm.weight"], value)})
    with pytest.raises(CheckpointError, match="'norm.weight' holds non-finite values"):
        load_checkpoint(path, target=target)


def test_no_pickle_anywhere():
    import pathlib
    import re

    src = pathlib.Path(__file__).parents[2] / "src"
    for f in src.rglob("*.py"):
        text = f.read_text()
        assert not re.search(r"^\s*(import|from)\s+pickle|pickle\.(loads?|dumps?)\(|torch\.save\(", text, re.M), f
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{f}: {line}"
