"""`--format llamacpp`: export -> import is bit-identical (f32, f16, bf16) for random EAGLE-3 and DFlash drafts and
taps, the GGUF holds what llama.cpp reads (ids in its numbering, absolute d2t, no t2d, q/k in its rope order, the
target GGUF's vocabulary), and what llama.cpp cannot express or a damaged file is refused."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from tiny import build_dflash, build_draft, build_target
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.contract import to_engine
from eaglewire.errors import CheckpointError, ContractMismatch, TranslationError
from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.convert import export_draft, import_draft
from eaglewire.export.gguf_draft import permute_qk, unpermute_qk
from eaglewire.families import BlockWiring
from eaglewire.norms import NormFlags

L = 8
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=L)


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory, target):
    """A stand-in target GGUF holding only a vocabulary (what `convert_hf_to_gguf.py --vocab-only` writes)."""
    path = tmp_path_factory.mktemp("vocab") / "target.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(target.vocab_size)])
    w.add_token_types([1] * target.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_mask_token_id(7)  # a target's own mask id: a DFlash draft's must win
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def _read(out):
    r = gguf.GGUFReader(str(out / lay.GGUF_FILE))
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: t for t in r.tensors}


taps3 = st.lists(st.integers(0, L - 1), min_size=3, max_size=3, unique=True).map(lambda t: tuple(sorted(t)))
norms = st.sampled_from(
    [
        NormFlags(),
        NormFlags(norm_before_fc=True),
        NormFlags(norm_before_residual=True),
        NormFlags(norm_before_fc=True, norm_before_residual=True),
    ]
)


@SETTINGS
@given(
    taps=taps3,
    norm=norms,
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([None, torch.float16, torch.bfloat16]),
    draft_vocab=st.sampled_from([32, 100, 128]),
)
def test_eagle3_round_trip_is_bit_identical(tmp_path_factory, target, taps, norm, seed, dtype, draft_vocab):
    draft, contract = build_draft(target, taps=taps, seed=seed, norm=norm, draft_vocab=draft_vocab)
    if dtype is not None:
        draft.to(dtype)
    out = export_draft(draft, contract, tmp_path_factory.mktemp("e3"), "llamacpp")
    kv, tensors = _read(out)
    assert kv[lay.ARCH_KEY] == "eagle3" and kv["eagle3.target_layers"] == list(to_engine(taps, "llamacpp", L))
    assert kv["eagle3.norm_before_fc"] == norm.norm_before_fc and "t2d" not in tensors
    assert np.array_equal(np.array(tensors["d2t"].data), (draft.d2t + torch.arange(draft_vocab)).numpy())
    assert ("enc.output_norm.weight" in tensors) == norm.norm_before_fc
    back, c2 = import_draft(out, "llamacpp", target=target)
    assert c2 == contract and _same(draft, back)
    (out / "eaglewire_contract.json").unlink()  # rebuilt on the target from target_layers
    back, c3 = import_draft(out, "llamacpp", target=target)
    assert c3.taps == taps and c3.vocab_map_sha256 == contract.vocab_map_sha256 and _same(draft, back)


@SETTINGS
@given(
    taps=st.lists(st.integers(0, L - 1), min_size=1, max_size=4, unique=True).map(lambda t: tuple(sorted(t))),
    block=st.integers(2, 9),
    layers=st.integers(1, 2),
    every=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**16),
)
def test_dflash_round_trip_is_bit_identical(tmp_path_factory, target, vocab_gguf, taps, block, layers, every, seed):
    draft, contract = build_dflash(target, taps=taps, block_size=block, layers=layers, vocab_every=every, seed=seed)
    out = export_draft(draft, contract, tmp_path_factory.mktemp("df"), "llamacpp", vocab_from=vocab_gguf)
    kv, tensors = _read(out)
    assert kv["dflash.target_layers"] == list(taps) and kv["dflash.block_size"] == block
    assert kv[lay.MASK_TOKEN_KEY] == contract.block.mask_token_id and kv["dflash.attention.causal"] is False
    assert ("d2t" in tensors) == (every is not None) and "t2d" not in tensors
    back, c2 = import_draft(out, "llamacpp", target=target)
    assert c2 == contract and _same(draft, back)


@given(heads=st.integers(1, 6), hd=st.integers(1, 8).map(lambda h: 2 * h), cols=st.integers(1, 5))
def test_qk_permutation_is_invertible_and_is_llamacpps(heads, hd, cols):
    """permute_qk is conversion/llama.py's LlamaModel.permute (rows of each head: evens then odds interleaved)."""
    w = torch.arange(heads * hd * cols, dtype=torch.float32).reshape(heads * hd, cols)
    p = permute_qk(w, heads)
    assert torch.equal(unpermute_qk(p, heads), w)
    half = hd // 2
    order = [h * hd + (j // 2) + (j % 2) * half for h in range(heads) for j in range(hd)]
    assert torch.equal(p, w[order])


def test_dtypes_and_the_vocabulary(tmp_path, target, vocab_gguf):
    draft, contract = build_draft(target, taps=(1, 3, 6))
    out = export_draft(draft, contract, tmp_path / "q", "llamacpp", gguf_dtype="q8_0", vocab_from=vocab_gguf)
    kv, tensors = _read(out)
    assert tensors["fc.weight"].tensor_type.name == "Q8_0" and tensors["output_norm.weight"].tensor_type.name == "F32"
    assert kv["general.file_type"] == 7 and kv["tokenizer.ggml.tokens"][:2] == ["t0", "t1"]
    assert kv[lay.MASK_TOKEN_KEY] == 7  # an EAGLE-3 draft keeps the target's vocabulary as it is
    back, _ = import_draft(out, "llamacpp", target=target)
    assert back.fc.weight.dtype == torch.float32 and (back.fc.weight - draft.fc.weight).abs().max() < 0.05
    empty = tmp_path / "empty.gguf"
    w = gguf.GGUFWriter(str(empty), "llama")
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match="holds no vocabulary"):
        export_draft(draft, contract, tmp_path / "v", "llamacpp", vocab_from=empty)


def test_what_llamacpp_cannot_express_is_refused(tmp_path, target):
    cases = [
        (build_draft(target, taps=(1, 3)), "exactly 3 target layers"),
        (build_draft(target, taps=(1, 3, 6), norm=NormFlags(fc_norm=True)), r"does not implement \['fc_norm'\]"),
        (build_draft(target, taps=(1, 3, 6), norm=NormFlags(norm_output=True)), "norm_output"),
        (build_draft(target, taps=(1, 3, 6), num_layers=2), "1 decoder layer"),
    ]
    for (draft, contract), match in cases:
        with pytest.raises(CheckpointError, match=match):
            export_draft(draft, contract, tmp_path / "x", "llamacpp")
    draft, contract = build_draft(target, taps=(1, 3, L))
    with pytest.raises(TranslationError, match=f"cannot express tap boundary {L}"):
        export_draft(draft, contract, tmp_path / "x", "llamacpp")
    draft, contract = build_draft(target, taps=(1, 3, 6), norm=NormFlags(norm_before_fc=True))
    with pytest.raises(CheckpointError, match=r"0.3.30 does not implement \['norm_before_fc'\]"):
        export_draft(draft, contract, tmp_path / "x", "llamacpp", engine_version="0.3.30")
    flash, fc = build_dflash(target, taps=(1, 3))
    with pytest.raises(CheckpointError, match="0.3.30 has no dflash drafter"):
        export_draft(flash, fc, tmp_path / "x", "llamacpp", engine_version="0.3.30")
    for block in (
        BlockWiring(4, 255, anchor_layout="anchor_first"),
        BlockWiring(4, 255, sliding_layers=(0,), sliding_window=8),
    ):
        bad = dataclasses.replace(fc, block=block)
        with pytest.raises(CheckpointError, match="one attention rule"):
            export_draft(flash, bad, tmp_path / "x", "llamacpp")
    assert not (tmp_path / "x").exists()


def _rewrite(src, dst, *, fields=None, extra=None):
    """A copy of GGUF `src` with some fields replaced and an extra tensor (a damaged or edited file)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields[lay.ARCH_KEY].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == lay.ARCH_KEY:
            continue
        value = (fields or {}).get(name, f.contents())
        w.add_key_value(name, value, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_damaged_or_edited_files_are_refused(tmp_path, target):
    draft, contract = build_draft(target, taps=(1, 3, 6))
    out = export_draft(draft, contract, tmp_path / "e", "llamacpp")
    f = out / lay.GGUF_FILE
    _rewrite(f, tmp_path / "a.gguf", fields={"eagle3.target_layers": [2, 15, 27]})
    (tmp_path / "a.gguf").replace(f)
    with pytest.raises(ContractMismatch, match="target_layers disagree with the wiring contract"):
        import_draft(out, "llamacpp", target=target)
    out = export_draft(draft, contract, tmp_path / "e2", "llamacpp")
    _rewrite(out / lay.GGUF_FILE, tmp_path / "b.gguf", extra={"blk.0.attn_conv_base": np.zeros(4, np.float32)})
    (tmp_path / "b.gguf").replace(out / lay.GGUF_FILE)
    with pytest.raises(CheckpointError, match="unexpected tensor 'blk.0.attn_conv_base'"):
        import_draft(out, "llamacpp", target=target)
    (out / lay.GGUF_FILE).write_bytes(b"GGUF" + b"\0" * 40)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        import_draft(out, "llamacpp", target=target)


def test_cli_prints_the_server_line_and_imports_back(tmp_path, target, vocab_gguf):
    draft, contract = build_draft(target, taps=(1, 3, 6))
    native = export_draft(draft, contract, tmp_path / "native", "native")
    r = CliRunner().invoke(
        app,
        [
            "export",
            str(native),
            "--format",
            "llamacpp",
            "--out",
            str(tmp_path / "g"),
            "--target-gguf",
            str(vocab_gguf),
            "--dtype",
            "q8_0",
            "--spec-draft-n-max",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    line = (
        f"llama-server -m {vocab_gguf} -md {tmp_path / 'g' / lay.GGUF_FILE} --spec-type draft-eagle3 "
        "--spec-draft-n-max 2"
    )
    text = r.output.replace("\n", "")
    assert line in text and "eagle3.target_layers [1, 3, 6]" in text
    r = CliRunner().invoke(
        app,
        ["export", str(native), "--format", "llamacpp", "--out", str(tmp_path / "f"), "--target-gguf", str(vocab_gguf)],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["import", str(tmp_path / "f"), "--format", "llamacpp", "--out", str(tmp_path / "n")])
    assert r.exit_code == 0, r.output
    back, _ = import_draft(tmp_path / "n", "native", target=target)
    assert _same(draft, back)


def test_cli_exports_a_dflash_draft(tmp_path, target, vocab_gguf):
    draft, contract = build_dflash(target, taps=(1, 3, 6), block_size=5)
    native = export_draft(draft, contract, tmp_path / "native", "native")
    r = CliRunner().invoke(
        app,
        ["export", str(native), "--format", "llamacpp", "--out", str(tmp_path / "g"), "--target-gguf", str(vocab_gguf)],
    )
    assert r.exit_code == 0, r.output
    text = r.output.replace("\n", "")
    assert "dflash.target_layers [1, 3, 6]" in text and "--spec-type draft-dflash --spec-draft-n-max 4" in text


def test_import_without_a_contract_file(tmp_path, target):
    """A GGUF without eaglewire_contract.json: its target_layers read in llama.cpp's numbering (--no-measure), the
    contract marked as inferred; measuring a GGUF draft's wiring is refused by name, not attempted."""
    from eaglewire.compose import load_draft
    from eaglewire.doctor.measures import measured_taps
    from eaglewire.errors import EaglewireError

    draft, contract = build_draft(target, taps=(0, 3, 7))  # boundary 0: llama.cpp's input of layer 0
    out = export_draft(draft, contract, tmp_path / "g", "llamacpp")
    (out / "eaglewire_contract.json").unlink()
    back = load_draft(out, target)  # the layout detected: a directory holding a GGUF and no config.json
    c2 = back.contract
    assert c2.taps == (0, 3, 7) and c2.inferred["source"] == "engine_config" and _same(draft, back)
    with pytest.raises(EaglewireError, match="measuring a GGUF draft's wiring is not built yet"):
        load_draft(out, target, measure=measured_taps)


def test_wiring_translate_to_llamacpp():
    r = CliRunner().invoke(
        app,
        ["wiring", "translate", "--to", "llamacpp", "-L", "30", "--taps", "1,8,14", "--from", "specforge", "--json"],
    )
    assert r.exit_code == 0, r.output
    assert '"ids": [\n    2,\n    9,\n    15\n  ]' in r.output  # SpecForge's output-of-layer ids are inputs of the next
    r = CliRunner().invoke(app, ["wiring", "translate", "--family", "dflash", "--to", "llamacpp", "-L", "30"])
    assert r.exit_code == 0 and "llamacpp: dflash.target_layers (GGUF) = [2, 9, 15, 21, 28]" in r.output
    r = CliRunner().invoke(app, ["wiring", "translate", "--to", "llamacpp", "-L", "30", "--taps", "2,15,30"])
    assert r.exit_code == 2 and "cannot express tap boundary 30" in r.output
