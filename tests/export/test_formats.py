"""Formats: export -> import bit-identical for every layout, any-to-any, and every broken export refused."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_draft, build_target

from eaglewire.norms import NormFlags
from eaglewire.errors import CheckpointError, ContractMismatch, TranslationError
from eaglewire.export.base import CONTRACT_FILE
from eaglewire.export.convert import export_draft, import_draft

from eaglewire.export.engines import FORMATS

assert set(FORMATS) >= {"native", "sglang", "sglang-legacy", "vllm", "speculators", "eagle", "specforge"}


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=8)  # deep enough for the default taps [2, 4, 5]


@pytest.fixture(scope="module")
def drafted(target):
    return build_draft(target, taps=(2, 4, 5), seed=7)


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_import_bit_identical(tmp_path, target, drafted, fmt):
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / fmt, fmt)
    back, c2 = import_draft(out, fmt, target=target)
    assert c2 == contract and _same(draft, back)
    if fmt == "llamacpp":  # one GGUF file: its names and what it keeps are test_gguf_formats.py's
        return
    keys = set(load_file(str(out / "model.safetensors")))
    assert ("midlayer.self_attn.q_proj.weight" in keys) == (fmt not in ("vllm", "speculators", "native"))
    assert "embed_tokens.weight" not in keys and {"d2t", "t2d"} <= keys


def test_native_is_a_format_with_its_own_contract(tmp_path, target, drafted):
    """Any-to-any through the native checkpoint, keeping the file's dtype; measured taps are refused."""
    draft, contract = drafted
    a = export_draft(draft, contract, tmp_path / "a", "native", dtype=torch.bfloat16)
    mid, c = import_draft(a, "native")  # no target needed: the checkpoint carries its contract
    assert c == contract and mid.contract == contract and mid.fc.weight.dtype == torch.bfloat16
    back, c2 = import_draft(export_draft(mid, c, tmp_path / "b", "sglang"), "sglang", target=target)
    assert c2 == contract and torch.equal(back.fc.weight, draft.fc.weight.to(torch.bfloat16))
    with pytest.raises(CheckpointError, match="carries its contract"):
        import_draft(a, "native", target=target, taps=(1, 2, 3))


def test_engine_specific_configs(tmp_path, drafted):
    draft, contract = drafted
    sg = json.loads((export_draft(draft, contract, tmp_path / "s", "sglang") / "config.json").read_text())
    assert sg["architectures"] == ["LlamaForCausalLMEagle3"] and sg["tie_word_embeddings"] is False
    assert sg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert "eagle_aux_hidden_state_layer_ids" not in sg  # SGLang reads only the nested key
    vl = json.loads((export_draft(draft, contract, tmp_path / "v", "vllm") / "config.json").read_text())
    assert vl["speculators_model_type"] == "eagle3" and "model_type" not in vl
    assert vl["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and vl["norm_before_residual"] is False
    assert vl["transformer_layer_config"]["hidden_act"] == "silu"  # full layer config, no class defaults


def test_any_to_any_and_bf16(tmp_path, target, drafted):
    draft, contract = drafted
    a = export_draft(draft, contract, tmp_path / "a", "sglang", dtype=torch.bfloat16)
    mid, c = import_draft(a, "sglang", target=target)
    b = export_draft(mid, c, tmp_path / "b", "vllm")
    back, c2 = import_draft(b, "vllm", target=target)
    assert c2 == contract and back.fc.weight.dtype == torch.bfloat16
    assert torch.equal(back.fc.weight, draft.fc.weight.to(torch.bfloat16))


def test_contract_rebuilt_from_config_when_side_file_absent(tmp_path, target, drafted):
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    (out / CONTRACT_FILE).unlink()
    with pytest.raises(CheckpointError, match="--target"):
        import_draft(out, "vllm")
    back, c2 = import_draft(out, "vllm", target=target)
    assert c2.taps == contract.taps and c2.vocab_map_sha256 == contract.vocab_map_sha256 and _same(draft, back)


def _edit_weights(out, fn):
    t = load_file(str(out / "model.safetensors"))
    save_file(fn(t), str(out / "model.safetensors"))


@pytest.mark.parametrize(
    "damage,error,match",
    [
        (lambda t: {k: v for k, v in t.items() if k != "d2t"}, CheckpointError, r"missing \['d2t'\]"),
        (lambda t: {**t, "extra.weight": torch.zeros(2)}, CheckpointError, r"unexpected \['extra.weight'\]"),
        (
            lambda t: {**t, "fc.weight": t["fc.weight"][:, :10].contiguous()},
            CheckpointError,
            "'fc.weight' has the wrong shape",
        ),
        (
            lambda t: {("layers.0." + k[9:] if k.startswith("midlayer.") else k): v for k, v in t.items()},
            CheckpointError,
            "unexpected tensor 'layers.0.",
        ),
    ],
)
def test_broken_weights_refused(tmp_path, target, drafted, damage, error, match):
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / "s", "sglang")
    _edit_weights(out, damage)
    with pytest.raises(error, match=match):
        import_draft(out, "sglang", target=target)


def test_lost_or_edited_layer_ids_refused(tmp_path, target, drafted):
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / "s", "sglang")
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]  # vLLM's ids pasted into SGLang's config
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ContractMismatch, match="disagree with the wiring contract"):
        import_draft(out, "sglang", target=target)
    del cfg["eagle_config"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="layer-id list is missing"):
        import_draft(out, "sglang", target=target)


def test_exports_the_engine_would_run_differently_are_refused(tmp_path, target):
    multi, c = build_draft(target, taps=(2, 4, 5), num_layers=2)
    with pytest.raises(CheckpointError, match="cannot hold a 2-layer draft"):
        export_draft(multi, c, tmp_path / "m", "sglang")
    export_draft(multi, c, tmp_path / "m", "vllm")  # vLLM takes layers.N.*
    nbf, c = build_draft(target, taps=(2, 4, 5), norm=NormFlags(norm_before_fc=True))
    with pytest.raises(CheckpointError, match="does not implement \\['norm_before_fc'\\]") as err:
        export_draft(nbf, c, tmp_path / "n", "sglang")
    assert "serve it on vllm" in err.value.fix and "--norms eagle3|eagle3.1`" in err.value.fix  # what SGLang serves
    off, c = build_draft(target, taps=(1, 4, 5))
    with pytest.raises(TranslationError, match="hard-codes"):
        export_draft(off, c, tmp_path / "e", "eagle")
    emb, c = build_draft(target, taps=(0, 4, 5))
    with pytest.raises(TranslationError, match="embedding"):
        export_draft(emb, c, tmp_path / "g", "sglang")
    four, c = build_draft(target, taps=(2, 3, 4, 5))
    with pytest.raises(CheckpointError, match="exactly 3 taps"):
        export_draft(four, c, tmp_path / "f", "specforge")
    post, c = build_draft(target, taps=(2, 4, 5), norm=NormFlags(norm_output=True))
    with pytest.raises(CheckpointError, match="does not implement \\['norm_output'\\]"):
        export_draft(post, c, tmp_path / "p", "specforge")  # SpecForge always feeds the pre-norm state back


def test_norm_output_in_specforge_meaning(tmp_path, target, drafted):
    draft, contract = drafted
    sf = export_draft(draft, contract, tmp_path / "sf", "specforge")
    assert json.loads((sf / "config.json").read_text())["norm_output"] is True  # final norm before lm_head
    sg = export_draft(draft, contract, tmp_path / "sg", "sglang")
    assert json.loads((sg / "config.json").read_text())["norm_output"] is False  # pre-norm fed back
    cfg = json.loads((sg / "config.json").read_text())
    (sf / "config.json").write_text(json.dumps(cfg))  # an SGLang config where SpecForge reads one
    with pytest.raises(CheckpointError, match="no final norm before lm_head"):
        import_draft(sf, "specforge", target=target)


def test_rope_base_read_from_either_config_form(tmp_path, target, drafted):
    # transformers 5 (and speculators >= 0.9, which saves with it) writes the RoPE base only inside
    # rope_parameters; read as the 4.x key alone, such a draft came back with base 10000 and scored other
    # positions than it was trained on
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    cfg = json.loads((out / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    layer.pop("rope_theta")
    layer["rope_parameters"] = {"rope_theta": 123456.0, "rope_type": "default"}
    (out / "config.json").write_text(json.dumps(cfg))
    assert import_draft(out, "vllm", target=target)[0].cfg.rope_theta == 123456.0
    layer.pop("rope_parameters")
    (out / "config.json").write_text(json.dumps(cfg))
    assert import_draft(out, "vllm", target=target)[0].cfg.rope_theta == 10000.0  # neither form: the old default
