"""DFlash formats (z-lab HF, SGLang, vLLM/speculators): export -> import bit-identical, the engines' own
numbering in each config, and every broken or unportable export refused with what/expected/found/fix."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny import VOCAB, build_target

from eaglewire.errors import CheckpointError, ContractMismatch, TranslationError
from eaglewire.export.base import CONTRACT_FILE
from eaglewire.export.block_formats import DFLASH_FORMATS
from eaglewire.export.block import export_block_draft
from eaglewire.export.block_import import import_block_draft
from eaglewire.families import BlockWiring

FORMATS = (*DFLASH_FORMATS, "speculators")
L = 8


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=L)


def _draft(target, taps=(1, 3, 5, 7), layers=2, block=BlockWiring(block_size=4, mask_token_id=VOCAB - 1), seed=3):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    return build_dflash_draft(target, dflash_contract(target, taps, block), layers, seed=seed)


@pytest.fixture(scope="module")
def drafted(target):
    return _draft(target)


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_import_bit_identical(tmp_path, target, drafted, fmt):
    out = export_block_draft(drafted, drafted.contract, tmp_path / fmt, fmt)
    back, contract = import_block_draft(out, fmt, target=target)
    assert _same(back, drafted) and contract == drafted.contract and back.block == drafted.block
    # without the side file the contract is rebuilt from the config's ids and block fields on the target
    (out / CONTRACT_FILE).unlink()
    back, rebuilt = import_block_draft(out, fmt, target=target)
    assert _same(back, drafted) and rebuilt.taps == drafted.contract.taps and rebuilt.block == drafted.block
    torch.manual_seed(0)
    taps = torch.randn(1, 5, drafted.cfg.fc_in_features)
    ids = torch.tensor([[3, VOCAB - 1, VOCAB - 1, VOCAB - 1]])
    args = (taps, torch.arange(5)[None], ids, torch.arange(5, 9)[None], torch.ones(1, 4, 9, dtype=torch.bool))
    assert torch.equal(back(*args), drafted(*args))  # the same function, with the target's embedding attached


@settings(max_examples=15, deadline=None)
@given(
    taps=st.lists(st.integers(1, L - 1), min_size=1, max_size=5, unique=True).map(sorted),
    fmt=st.sampled_from(FORMATS),
    B=st.integers(2, 9),
)
def test_round_trip_property(tmp_path_factory, target, taps, fmt, B):
    d = _draft(target, tuple(taps), layers=1, block=BlockWiring(block_size=B, mask_token_id=5))
    out = export_block_draft(d, d.contract, tmp_path_factory.mktemp("p") / fmt, fmt)
    (out / CONTRACT_FILE).unlink()
    back, contract = import_block_draft(out, fmt, target=target)
    assert contract.taps == tuple(taps) and contract.block == d.block and _same(back, d)


def test_each_engine_numbering_and_fields(tmp_path, drafted):
    """Boundaries (1,3,5,7) of an 8-layer target: z-lab/SGLang write output-of-layer ids (b-1), speculators/vLLM
    capture ids (b), read as is by vLLM (algos.py update_dflash)."""
    cfg = {
        f: json.loads((export_block_draft(drafted, drafted.contract, tmp_path / f, f) / "config.json").read_text())
        for f in ("zlab", "sglang", "vllm")
    }
    z, s, v = cfg["zlab"], cfg["sglang"], cfg["vllm"]
    assert z["architectures"] == ["DFlashDraftModel"] and z["model_type"] == "qwen3"
    assert z["dflash_config"] == {"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 2, 4, 6]}
    assert z["block_size"] == 4 and z["num_target_layers"] == L and z["layer_types"] == ["full_attention"] * 2
    assert "eagle_aux_hidden_state_layer_ids" not in z  # vLLM would let it win over dflash_config
    assert s["dflash_config"] == {**z["dflash_config"], "block_size": 4, "num_target_layers": L}
    assert v["speculators_model_type"] == "dflash" and v["aux_hidden_state_layer_ids"] == [1, 3, 5, 7]
    assert v["sliding_window_non_causal"] is True and v["sample_from_anchor"] is False
    assert v["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3  # B-1
    for c in (z, v["transformer_layer_config"]):
        assert c["is_neox_style"] is True and c["rope_parameters"]["rope_theta"] == c["rope_theta"]


def test_last_layer_tap_only_where_the_engine_captures_it(tmp_path, target):
    d = _draft(target, taps=(2, L))  # boundary L: the last layer's pre-norm output
    back, _ = import_block_draft(export_block_draft(d, d.contract, tmp_path / "v", "vllm"), "vllm", target=target)
    assert _same(back, d)
    for fmt in ("zlab", "sglang"):  # z-lab reads hidden_states[L] (post-norm); SGLang captures before layer k+1
        with pytest.raises(TranslationError, match="boundary 8"):
            export_block_draft(d, d.contract, tmp_path / fmt, fmt)


def _edit(out, fn, name="config.json"):
    if name == "config.json":
        c = json.loads((out / name).read_text())
        fn(c)
        (out / name).write_text(json.dumps(c))
    else:
        t = load_file(out / name)
        fn(t)
        save_file(t, out / name)


DAMAGE = [
    ("extra tensor", lambda t: t.update({"lm_head.weight": torch.zeros(VOCAB, 64)}), "wrong set of tensors"),
    ("missing tensor", lambda t: t.pop("hidden_norm.weight"), "wrong set of tensors"),
    (
        "renamed",
        lambda t: t.update({"midlayer.mlp.up_proj.weight": t.pop("layers.0.mlp.up_proj.weight")}),
        "did you mean",
    ),
    ("shape", lambda t: t.update({"fc.weight": t["fc.weight"][:, :-64].contiguous()}), "wrong shape"),
    ("nan", lambda t: t["norm.weight"].__setitem__(0, float("nan")), "NaN"),
    ("inf", lambda t: t["layers.1.self_attn.k_norm.weight"].__setitem__(0, float("inf")), "inf"),
    ("dtype mix", lambda t: t.update({"norm.weight": t["norm.weight"].half()}), "mixed float dtypes"),
]


@pytest.mark.parametrize("fmt", ("zlab", "vllm"))
@pytest.mark.parametrize("what,damage,match", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_broken_weights_refused(tmp_path, target, drafted, fmt, what, damage, match):
    out = export_block_draft(drafted, drafted.contract, tmp_path / fmt, fmt)
    _edit(out, damage, "model.safetensors")
    with pytest.raises(CheckpointError, match=match) as err:
        import_block_draft(out, fmt, target=target)
    assert err.value.expected and err.value.found


CONFIG_DAMAGE = [
    ("zlab", "ids lost", lambda c: c["dflash_config"].pop("target_layer_ids"), CheckpointError, "layer-id list"),
    (
        "zlab",
        "ids edited",
        lambda c: c["dflash_config"].update(target_layer_ids=[1, 2, 4, 6]),
        ContractMismatch,
        "disagrees",
    ),
    ("zlab", "mask edited", lambda c: c["dflash_config"].update(mask_token_id=3), ContractMismatch, "disagrees"),
    (
        "zlab",
        "vLLM override",
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 6, 7]),
        CheckpointError,
        "eagle_aux",
    ),
    ("zlab", "sliding", lambda c: c["dflash_config"].update(use_swa=True), CheckpointError, "use_swa"),
    ("zlab", "causal", lambda c: c.update(is_causal=True), CheckpointError, "is_causal"),
    ("zlab", "interleaved rope", lambda c: c.update(is_neox_style=False), CheckpointError, "neox"),
    ("zlab", "wrong arch", lambda c: c.update(architectures=["LlamaForCausalLMEagle3"]), CheckpointError, "not a zlab"),
    ("zlab", "block size", lambda c: c.pop("block_size"), CheckpointError, "block_size"),
    ("zlab", "speculators type", lambda c: c.update(speculators_model_type="dflash"), CheckpointError, "not a zlab"),
    ("vllm", "no speculators type", lambda c: c.pop("speculators_model_type"), CheckpointError, "not a vllm"),
    ("vllm", "wrong arch", lambda c: c.update(architectures=["LlamaForCausalLMEagle3"]), CheckpointError, "not a vllm"),
    ("vllm", "speculators default", lambda c: c.update(sliding_window_non_causal=False), CheckpointError, "causal"),
    ("vllm", "anchor-first", lambda c: c.update(sample_from_anchor=True), CheckpointError, "anchor"),
    ("vllm", "ids edited", lambda c: c.update(aux_hidden_state_layer_ids=[0, 3, 5, 7]), ContractMismatch, "disagrees"),
    ("vllm", "vocab size edited", lambda c: c.update(draft_vocab_size=VOCAB // 2), CheckpointError, "draft_vocab_size"),
]


@pytest.mark.parametrize("fmt,what,damage,error,match", CONFIG_DAMAGE, ids=[f"{d[0]}-{d[1]}" for d in CONFIG_DAMAGE])
def test_broken_configs_refused(tmp_path, target, drafted, fmt, what, damage, error, match):
    out = export_block_draft(drafted, drafted.contract, tmp_path / fmt, fmt)
    _edit(out, damage)
    with pytest.raises(error, match=match):
        import_block_draft(out, fmt, target=target)


def test_unportable_wiring_refused_on_export(tmp_path, target):
    for block in (
        BlockWiring(block_size=4, mask_token_id=5, causal=True),
        BlockWiring(block_size=4, mask_token_id=5, anchor_layout="anchor_first"),
        BlockWiring(block_size=4, mask_token_id=5, sliding_layers=(0,), sliding_window=8),
    ):
        d = _draft(target, layers=1, block=block)
        with pytest.raises(CheckpointError, match="cannot be written") as err:
            export_block_draft(d, d.contract, tmp_path / "x", "vllm")
        assert err.value.fix
    with pytest.raises(CheckpointError, match="no 'eagle'"):
        d = _draft(target, layers=1)
        export_block_draft(d, d.contract, tmp_path / "x", "eagle")


# ---- a reduced vocabulary (vLLM's DFlash loader: draft_vocab_size, lm_head, d2t) -------------------------------


def _reduced(target, kept):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.draft.vocab import VocabMap

    vmap = VocabMap.from_target_ids(torch.tensor(sorted(kept)), VOCAB)
    contract = dflash_contract(target, (1, 3, 5, 7), BlockWiring(block_size=4, mask_token_id=VOCAB - 1), vmap)
    return build_dflash_draft(target, contract, 1, seed=3, vmap=vmap), vmap


@settings(max_examples=10, deadline=None)
@given(kept=st.sets(st.integers(0, VOCAB - 1), min_size=1, max_size=VOCAB - 1))
def test_a_reduced_vocabulary_round_trips_as_vllm(tmp_path_factory, target, kept):
    d, vmap = _reduced(target, kept)
    out = export_block_draft(d, d.contract, tmp_path_factory.mktemp("r") / "vllm", "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == len(kept) and config["transformer_layer_config"]["vocab_size"] == VOCAB
    weights = load_file(out / "model.safetensors")
    assert weights["lm_head.weight"].shape == (len(kept), d.cfg.hidden_size)
    assert (torch.arange(len(kept)) + weights["d2t"]).tolist() == sorted(kept)  # offsets, as vLLM adds them
    back, contract = import_block_draft(out, "vllm", target=target)
    assert _same(back, d) and contract == d.contract
    (out / CONTRACT_FILE).unlink()  # the map is rebuilt from the weights, the contract with it
    back, rebuilt = import_block_draft(out, "vllm", target=target)
    assert _same(back, d) and rebuilt == d.contract
    ids = torch.tensor(sorted(kept))
    assert back.target_ids(torch.arange(len(kept))).tolist() == ids.tolist()


def test_a_reduced_vocabulary_is_refused_where_the_engine_has_no_head_of_its_own(tmp_path, target):
    d, _ = _reduced(target, range(0, VOCAB, 2))
    for fmt in ("zlab", "sglang"):
        with pytest.raises(CheckpointError, match="vocabulary") as err:
            export_block_draft(d, d.contract, tmp_path / fmt, fmt)
        assert "vllm" in err.value.fix


REDUCED_DAMAGE = [
    ("absolute ids", lambda t: t.update(d2t=t["d2t"] + torch.arange(len(t["d2t"]))), "OFFSETS"),
    ("another map", lambda t: t.update(d2t=torch.zeros_like(t["d2t"]), t2d=_first(len(t["d2t"]))), "vocab map named"),
    ("t2d lost", lambda t: t.pop("t2d"), "half a vocab map"),
    ("head rows", lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:-1].contiguous()}), "wrong shape"),
]


def _first(n):
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:n] = True
    return t2d


@pytest.mark.parametrize("what,damage,match", REDUCED_DAMAGE, ids=[d[0] for d in REDUCED_DAMAGE])
def test_a_damaged_vocab_map_is_refused(tmp_path, target, what, damage, match):
    from eaglewire.errors import EaglewireError

    d, _ = _reduced(target, range(1, VOCAB, 2))
    out = export_block_draft(d, d.contract, tmp_path / "v", "vllm")
    _edit(out, damage, "model.safetensors")
    with pytest.raises(EaglewireError, match=match):
        import_block_draft(out, "vllm", target=target)


def test_bf16_export_keeps_dtype(tmp_path, target, drafted):
    out = export_block_draft(drafted, drafted.contract, tmp_path / "b", "zlab", dtype=torch.bfloat16)
    back, _ = import_block_draft(out, "zlab", target=target)
    assert all(v.dtype == torch.bfloat16 for v in back.state_dict().values())


def test_speculators_own_architecture_name_reads_as_its_layout(tmp_path, target, drafted):
    """speculators 0.9.0's DFlashDraftModel.save_pretrained writes architectures ["DFlashDraftModel"] (z-lab's
    name) beside speculators_model_type "dflash" (benchmarks/peer_training/peer_training.py --family dflash reads a real one):
    the speculators layout is recognised by its model type, and read the same."""
    from eaglewire.export.block import block_layout

    out = export_block_draft(drafted, drafted.contract, tmp_path / "v", "vllm")
    _edit(out, lambda c: c.update(architectures=["DFlashDraftModel"]))
    config = json.loads((out / "config.json").read_text())
    assert block_layout(config) == "vllm" and block_layout(config, drafted.contract) == "vllm"
    back, contract = import_block_draft(out, "vllm", target=target)
    assert _same(back, drafted) and contract == drafted.contract
    with pytest.raises(CheckpointError, match="not a zlab"):
        import_block_draft(out, "zlab", target=target)


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_and_import_draft_route_by_family(tmp_path, target, drafted, fmt):
    """The one export/import entry points (export/convert.py) take a DFlash draft to its family's records."""
    from eaglewire.export.convert import export_draft, import_draft

    out = export_draft(drafted, drafted.contract, tmp_path / fmt, fmt)
    back, contract = import_draft(out, fmt, target=target)
    assert _same(back, drafted) and contract == drafted.contract


def test_vllm_reads_our_dflash_exports_as_we_wrote_them(tmp_path, target):
    """vLLM's own config code (no engine start) on our z-lab and speculators exports, and on the two mistakes
    its code makes silent: the ids it captures are our boundaries, every layer non-causal, our RoPE base and
    mask token; speculators' default sliding_window_non_causal=false turns every layer causal, and an
    eagle_aux_hidden_state_layer_ids left in a z-lab config wins over dflash_config."""
    import os
    import subprocess
    from pathlib import Path

    from eaglewire.vllm_client.server import vllm_available, vllm_python

    if not vllm_available():
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI must build vLLM's CPU build (scripts/vllm_venv.sh)")
        pytest.skip("vLLM's CPU build is not installed (scripts/vllm_venv.sh)")
    d = _draft(target, taps=(2, 4, 7), layers=2)
    dirs = {f: export_block_draft(d, d.contract, tmp_path / f, f) for f in ("zlab", "sglang", "vllm")}
    dirs["spec-default"] = export_block_draft(d, d.contract, tmp_path / "sd", "vllm")
    _edit(dirs["spec-default"], lambda c: c.update(sliding_window_non_causal=False))
    reduced, _ = _reduced(target, range(0, VOCAB, 2))
    dirs["reduced"] = export_block_draft(reduced, reduced.contract, tmp_path / "rv", "vllm")
    dirs["zlab-override"] = export_block_draft(d, d.contract, tmp_path / "zo", "zlab")
    _edit(dirs["zlab-override"], lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]))
    script = Path(__file__).parents[1] / "clients" / "vllm_dflash_config.py"
    out = subprocess.run(
        [str(vllm_python()), str(script), *map(str, dirs.values())], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = {f: json.loads(out.stdout.strip().splitlines()[-1])[str(p)] for f, p in dirs.items()}
    for f in ("zlab", "sglang", "vllm"):
        assert got[f]["aux"] == [2, 4, 7], (f, got[f])  # vLLM captures the boundaries we trained on
        assert got[f]["causal"] == [False, False] and got[f]["neox"] is True, (f, got[f])
        assert got[f]["rope_theta"] == d.cfg.rope_theta and got[f]["mask_token_id"] == VOCAB - 1, (f, got[f])
        assert got[f]["architectures"] == ["DFlashDraftModel"], (f, got[f])
    assert got["vllm"]["draft_vocab_size"] == VOCAB  # vLLM shares the target's head
    assert got["reduced"]["draft_vocab_size"] == VOCAB // 2  # vLLM builds a head of V_d rows and loads d2t
    assert got["spec-default"]["causal"] == [True, True]  # why our speculators export writes true
    assert got["zlab-override"]["aux"] == [1, 2, 3]  # why a z-lab config with this key is refused on import
