"""DFlash in the contract (EAGLE-3 artifacts unchanged, the block record round-trips) and the DFlash draft
model: z-lab's state-dict keys, the training forward's shapes and masking, and the decoding path (context
cache + one block pass) equal to the training forward."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import HIDDEN, VOCAB, build_target

import eaglewire
from eaglewire.contract import WiringContract, from_engine, to_engine
from eaglewire.export.engines import block_fields
from eaglewire.draft.dflash import DFlashDraft, build_dflash_draft
from eaglewire.draft.dflash_contract import dflash_contract, pick_mask_token
from eaglewire.errors import ContractMismatch, TapWidthError
from eaglewire.families import BlockWiring, zlab_default_ids
from eaglewire.norms import NORM_PRESETS

ASSET = Path(eaglewire.__file__).parent / "assets" / "drafts" / "smollm2-135m" / "config.json"
TAPS = (1, 2, 3)


def _draft(layers=2, block=BlockWiring(block_size=4, mask_token_id=VOCAB - 1), seed=0):
    target = build_target("llama")
    contract = dflash_contract(target, TAPS, block)
    return target, build_dflash_draft(target, contract, layers, seed=seed)


# ---- contract ----------------------------------------------------------------------------------


def test_shipped_eagle3_contract_reads_and_fingerprints_as_before():
    stored = json.loads(ASSET.read_text())["contract"]
    c = WiringContract.from_dict(stored)
    assert c.family == "eagle3" and c.block is None
    assert c.to_dict() == stored  # no new field appears in an EAGLE-3 contract's JSON
    # the fingerprint is the hash of exactly the stored wiring fields (what it was before families existed)
    import hashlib

    wiring = {k: v for k, v in stored.items() if k != "inferred"}
    want = hashlib.sha256(json.dumps(wiring, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert c.fingerprint() == want
    # an explicit eagle3 family is the same contract
    assert WiringContract.from_dict({**stored, "family": "eagle3", "block": None}).fingerprint() == want


def test_dflash_contract_round_trips_and_differs():
    target = build_target("llama")
    block = BlockWiring(block_size=8, mask_token_id=5, sliding_layers=(1,), sliding_window=16)
    c = dflash_contract(target, TAPS, block)
    again = WiringContract.from_json(c.to_json())
    assert again == c and again.fingerprint() == c.fingerprint()
    assert c.draft_vocab_size == VOCAB and c.vocab_map_sha256 is None
    assert c.fingerprint() != target.contract(TAPS).fingerprint()
    other = dataclasses.replace(c, block=dataclasses.replace(block, mask_token_id=6))
    assert [d[0] for d in c.differences(other)] == ["block.mask_token_id"]


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(2, 32),
    mask=st.integers(0, VOCAB - 1),
    layout=st.sampled_from(["bonus", "anchor_first"]),
    causal=st.sampled_from([None, True, False]),
    sliding=st.lists(st.integers(0, 7), unique=True, max_size=3),
)
def test_block_wiring_json_round_trip(B, mask, layout, causal, sliding):
    sliding = tuple(sorted(sliding))
    block = BlockWiring(B, mask, layout, causal=causal, sliding_layers=sliding, sliding_window=4 if sliding else None)
    assert BlockWiring.from_dict(json.loads(json.dumps(block.to_dict()))) == block
    assert block.drafts_per_round == (B - 1 if layout == "bonus" else B)


@pytest.mark.parametrize(
    "bad",
    [
        dict(block_size=1),
        dict(anchor_layout="first"),
        dict(rope_style="gptj"),
        dict(sliding_layers=(2, 1), sliding_window=4),
        dict(sliding_layers=(1,)),
        dict(sliding_window=4),
    ],
)
def test_bad_block_wiring_is_refused(bad):
    with pytest.raises(ContractMismatch):
        BlockWiring(**{"block_size": 4, "mask_token_id": 3, **bad})


def test_family_fields_must_agree():
    target = build_target("llama")
    base = target.contract(TAPS)
    block = BlockWiring(4, 3)
    with pytest.raises(ContractMismatch, match="needs block wiring"):
        dataclasses.replace(base, family="dflash")
    with pytest.raises(ContractMismatch, match="has no block wiring"):
        dataclasses.replace(base, block=block)
    with pytest.raises(ContractMismatch, match="unknown drafter family"):
        dataclasses.replace(base, family="medusa")
    with pytest.raises(ContractMismatch, match="row of the target"):
        dflash_contract(target, TAPS, BlockWiring(4, VOCAB))
    with pytest.raises(ContractMismatch, match="norm flags"):
        dataclasses.replace(dflash_contract(target, TAPS, block), norm=NORM_PRESETS["eagle3.1"])
    with pytest.raises(ContractMismatch, match="wrong fields"):
        WiringContract.from_dict(
            {
                **dflash_contract(target, TAPS, block).to_dict(),
                "block": {"block_size": 4, "mask_token_id": 3, "mask_embedding": 1},
            }
        )


def test_dflash_engine_numbering_for_30_layers():
    """z-lab's default five taps of a 30-layer target, in every engine's field (brief §1.4, §6)."""
    ids = zlab_default_ids(30, 5)
    assert ids == (1, 8, 14, 20, 27)  # z-lab build_target_layer_ids: round(1 + i*26/4), Python rounding
    b = from_engine(ids, "zlab", 30)
    assert b == (2, 9, 15, 21, 28)  # boundary k+1 = HF hidden_states[k+1]
    got = {(f.engine, f.field): to_engine(b, f.convention, 30) for f in block_fields("dflash")}
    assert got == {
        ("zlab", "dflash_config.target_layer_ids"): ids,
        ("sglang", "dflash_config.target_layer_ids"): ids,
        ("vllm", "dflash_config.target_layer_ids"): ids,
        ("vllm", "eagle_aux_hidden_state_layer_ids"): b,
        ("llamacpp", "dflash.target_layers (GGUF)"): b,  # the input of layer id: the boundary
        ("speculators", "aux_hidden_state_layer_ids"): b,
    }
    # the final boundary: vLLM captures it, z-lab's HF reference (post-norm entry) and SGLang cannot
    assert to_engine((2, 30), "vllm-dflash", 30) == (1, 29)
    for conv in ("zlab", "sglang-dflash"):
        with pytest.raises(Exception, match="cannot express"):
            to_engine((2, 30), conv, 30)


# ---- model -------------------------------------------------------------------------------------


def test_state_dict_is_zlab_layout():
    _, d = _draft(layers=2)
    per_layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    want = {f"layers.{i}.{k}" for i in range(2) for k in per_layer} | {"fc.weight", "hidden_norm.weight", "norm.weight"}
    sd = d.state_dict()
    assert set(sd) == want
    assert tuple(sd["fc.weight"].shape) == (HIDDEN, 3 * HIDDEN)
    assert tuple(sd["layers.0.self_attn.q_norm.weight"].shape) == (d.cfg.head_dim,)


def _inputs(N=2, S=6, Q=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(N, S, 3 * HIDDEN, generator=g)
    ctx_pos = torch.arange(S).expand(N, -1)
    ids = torch.randint(0, VOCAB, (N, Q), generator=g)
    anchor = torch.tensor([2, 4])[:N]
    block_pos = anchor[:, None] + torch.arange(Q)
    mask = torch.cat(
        [(ctx_pos[:, None, :] < anchor[:, None, None]).expand(N, Q, S), torch.ones(N, Q, Q, dtype=torch.bool)], -1
    )
    return taps, ctx_pos, ids, block_pos, mask


def test_forward_shapes_and_head():
    _, d = _draft()
    taps, ctx_pos, ids, block_pos, mask = _inputs()
    h = d(taps, ctx_pos, ids, block_pos, mask)
    assert h.shape == (2, 4, HIDDEN)
    assert d.logits(h).shape == (2, 4, VOCAB)
    with pytest.raises(TapWidthError):
        d(taps[..., :-HIDDEN], ctx_pos, ids, block_pos, mask)
    with pytest.raises(ValueError, match="at least one key"):
        d(taps, ctx_pos, ids, block_pos, torch.zeros_like(mask))


def test_mask_hides_context_and_block_is_bidirectional():
    _, d = _draft()
    taps, ctx_pos, ids, block_pos, mask = _inputs()
    with torch.no_grad():
        h = d(taps, ctx_pos, ids, block_pos, mask)
        hidden_ctx = taps.clone()
        hidden_ctx[0, 2:] += 1.0  # row 0's anchor is at 2: positions >= 2 are masked for it
        assert torch.equal(d(hidden_ctx, ctx_pos, ids, block_pos, mask)[0], h[0])
        seen = taps.clone()
        seen[0, 1] += 1.0
        assert not torch.allclose(d(seen, ctx_pos, ids, block_pos, mask)[0], h[0])
        later = ids.clone()
        later[:, -1] = (later[:, -1] + 1) % VOCAB  # the last block token changes slot 0: bidirectional
        assert not torch.allclose(d(taps, ctx_pos, later, block_pos, mask)[:, 0], h[:, 0])


def test_causal_and_sliding_layers_follow_the_wiring():
    for block in (
        BlockWiring(4, VOCAB - 1, causal=True),
        BlockWiring(4, VOCAB - 1, sliding_layers=(0, 1), sliding_window=3),
    ):
        _, d = _draft(block=block)
        taps, ctx_pos, ids, block_pos, mask = _inputs()
        with torch.no_grad():
            h = d(taps, ctx_pos, ids, block_pos, mask)
            later = ids.clone()
            later[:, -1] = (later[:, -1] + 1) % VOCAB
            assert torch.equal(d(taps, ctx_pos, later, block_pos, mask)[:, :-1], h[:, :-1])  # causal in block
    # vLLM's dflash_config.causal=false makes sliding layers bidirectional in the block too
    _, d = _draft(block=BlockWiring(4, VOCAB - 1, causal=False, sliding_layers=(0, 1), sliding_window=30))
    taps, ctx_pos, ids, block_pos, mask = _inputs()
    with torch.no_grad():
        later = ids.clone()
        later[:, -1] = (later[:, -1] + 1) % VOCAB
        h, h_later = d(taps, ctx_pos, ids, block_pos, mask), d(taps, ctx_pos, later, block_pos, mask)
        assert not torch.allclose(h_later[:, 0], h[:, 0])
    with pytest.raises(ContractMismatch, match="beyond the draft's layers"):
        _draft(layers=2, block=BlockWiring(4, 3, sliding_layers=(2,), sliding_window=3))


def test_decoding_path_equals_training_forward():
    """extend_context + draft_block (cached context keys/values) == forward with context < anchor."""
    _, d = _draft(layers=2)
    B, n = d.block.block_size, 5
    g = torch.Generator().manual_seed(1)
    taps = torch.randn(1, n, 3 * HIDDEN, generator=g)
    cache = d.new_cache(32)
    d.extend_context(cache, taps[:, :3])
    d.extend_context(cache, taps[:, 3:])  # in two pieces, as decoding appends accepted positions
    got = d.draft_block(cache, anchor=7)
    ids = torch.tensor([[7] + [d.block.mask_token_id] * (B - 1)])
    mask = torch.ones(1, B, n + B, dtype=torch.bool)
    with torch.no_grad():
        want = d(taps, torch.arange(n)[None], ids, torch.arange(n, n + B)[None], mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pick_mask_token_on_a_smollm2_like_tokenizer():
    from transformers import AddedToken

    class Tok:
        bos_token, eos_token, pad_token = "<|im_start|>", "<|im_end|>", None
        chat_template = "{{'<|im_start|>' + m['role']}}<|im_end|>"
        mask_token = None
        added_tokens_decoder = {
            i: AddedToken(t, special=True)
            for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<empty_output>"])
        }

        def get_vocab(self):
            return {t.content: i for i, t in self.added_tokens_decoder.items()}

    assert pick_mask_token(Tok()) == 4
    Tok.added_tokens_decoder = {**Tok.added_tokens_decoder, 9: AddedToken("<|MASK|>", special=True)}
    assert pick_mask_token(Tok()) == 9


def test_random_init_is_seeded():
    _, a = _draft(seed=3)
    _, b = _draft(seed=3)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert isinstance(a, DFlashDraft) and a.contract is not None and a.contract.family == "dflash"


def test_cli_translate_family_prints_every_field():
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    r = CliRunner().invoke(app, ["wiring", "translate", "--family", "dflash", "-L", "30", "--to", "vllm", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["boundaries"] == [2, 9, 15, 21, 28]
    assert {f["field"]: f["ids"] for f in out["fields"]} == {
        "dflash_config.target_layer_ids": [1, 8, 14, 20, 27],
        "eagle_aux_hidden_state_layer_ids": [2, 9, 15, 21, 28],
    }
    r = CliRunner().invoke(app, ["wiring", "translate", "--family", "dflash", "-L", "30", "--to", "all", "--json"])
    assert {f["engine"] for f in json.loads(r.stdout)["fields"]} == {
        "zlab",
        "sglang",
        "vllm",
        "speculators",
        "llamacpp",
    }
    r = CliRunner().invoke(
        app,
        [
            "wiring",
            "translate",
            "--family",
            "dflash",
            "-L",
            "30",
            "--to",
            "speculators",
            "--taps",
            "2,9,15,21,29",
            "--from",
            "speculators",
        ],
    )
    assert r.exit_code == 0 and "[2, 9, 15, 21, 29]" in r.output
    r = CliRunner().invoke(
        app,
        ["wiring", "translate", "--family", "dflash", "-L", "30", "--to", "zlab", "--taps", "2,30", "--from", "vllm"],
    )
    assert r.exit_code == 2 and "cannot express tap boundary 30" in r.output


def test_native_checkpoint_round_trip_is_strict(tmp_path):
    from safetensors.torch import load_file, save_file

    from eaglewire.errors import CheckpointError
    from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint

    target, d = _draft(layers=2, block=BlockWiring(5, VOCAB - 1, sliding_layers=(1,), sliding_window=8))
    path = save_checkpoint(d, d.contract, tmp_path / "dflash")
    back = load_checkpoint(path, target=target)
    assert isinstance(back, DFlashDraft) and back.contract == d.contract and back.block == d.block
    assert all(torch.equal(back.state_dict()[k], v) for k, v in d.state_dict().items())
    taps, ctx_pos, ids, block_pos, mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            back.logits(back(taps, ctx_pos, ids, block_pos, mask)), d.logits(d(taps, ctx_pos, ids, block_pos, mask))
        )
    weights = load_file(path / "model.safetensors")
    save_file({**weights, "embed_tokens.weight": target.embedding().detach().clone()}, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="wrong set of tensors"):
        load_checkpoint(path, target=target)
    weights["norm.weight"][0] = float("nan")
    save_file(weights, path / "model.safetensors")
    with pytest.raises(CheckpointError):
        load_checkpoint(path, target=target)
    with pytest.raises(CheckpointError, match="no embedding"):
        save_checkpoint(d, d.contract, tmp_path / "again", save_embedding=True)


@pytest.mark.real_target
def test_default_contract_for_the_embedded_target():
    """SmolLM2 (30 layers) gets z-lab's five taps as boundaries and the reserved <empty_output> as mask."""
    from eaglewire.draft.dflash_contract import default_dflash_contract
    from eaglewire.target.loader import load_target

    target = load_target()
    c = default_dflash_contract(target, 8)
    assert c.taps == (2, 9, 15, 21, 28) and c.block.mask_token_id == 16 and c.block.block_size == 8
    assert target.tokenizer.convert_ids_to_tokens(16) == "<empty_output>"
    assert c.draft_vocab_size == target.vocab_size == 49152
