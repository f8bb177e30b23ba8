"""Each GGUF finding fires on its broken GGUF and not on the healthy one: our own `export --format llamacpp`
of a tiny draft, copied with one knob broken (tests/llamacpp_gguf.rewrite), or its contract side file edited;
target GGUFs written with the sizes and vocabulary under test. No converter needed."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from llamacpp_gguf import rewrite
from tiny import build_dflash, build_draft, build_target

from eaglewire.api import check
from eaglewire.capture.boundaries import sample_target
from eaglewire.doctor.gguf_inspect import inspect_gguf
from eaglewire.doctor.gguf_measure import run_gguf_measurement
from eaglewire.errors import CheckpointError
from eaglewire.export.gguf_draft import export_gguf
from eaglewire.export.gguf_read import read_gguf_draft
from eaglewire.norms import NormFlags

L, TOKENS = 8, [f"t{i}" for i in range(256)]


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=L)


def fake_target_gguf(path, hidden=64, layers=L, vocab=256, tokens=TOKENS):
    """A target GGUF's metadata (what the doctor compares), no weights."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama")
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def made(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    tg = fake_target_gguf(root / "tg" / "target.gguf")
    draft, contract = build_draft(target, taps=(1, 3, 6), seed=5)
    nbr, nbr_c = build_draft(target, taps=(1, 3, 6), seed=6, norm=NormFlags(norm_before_residual=True))
    return {
        "tg": tg,
        "root": root,
        "ours": export_gguf(draft, contract, root / "e", vocab_from=tg) / "draft.gguf",
        "nbr": export_gguf(nbr, nbr_c, root / "n", vocab_from=tg) / "draft.gguf",
    }


def _got(path, target=None, **kw):
    r = check(path, "llamacpp", target, measure=False, **kw)
    return r, {(f.level, f.check) for f in r.findings}


def _side(src, dst_dir, **changes):
    side = json.loads((src.parent / "eaglewire_contract.json").read_text())
    for key, value in changes.items():
        node = side
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    (dst_dir / "eaglewire_contract.json").write_text(json.dumps(side))


def test_healthy_exports_have_no_finding(made, target):
    for name in ("ours", "nbr"):
        r, _ = _got(made[name], target, target_gguf=made["tg"])
        assert r.findings == [], r.to_json()


def test_not_a_draft(made):
    with pytest.raises(CheckpointError, match="architecture 'llama', not a draft"):
        read_gguf_draft(made["tg"])
    with pytest.raises(CheckpointError, match="is a eagle3 draft, not a target"):
        check(made["ours"], "llamacpp", None, target_gguf=made["ours"])


@pytest.mark.parametrize(
    "name,change,code,words",
    [
        ("absent", {"drop": ("eagle3.target_layers",)}, "layer_ids", "is absent"),
        ("count", {"set_keys": {"eagle3.target_layers": [1, 3, 5, 6]}}, "layer_ids", "holds 4 ids"),
        ("final", {"set_keys": {"eagle3.target_layers": [1, 3, 8]}}, "layer_ids", "cannot be captured"),
        ("default", {"set_keys": {"eagle3.target_layers": [2, 4, 5]}}, "layer_ids", "converter default, not"),
        ("sglang", {"set_keys": {"eagle3.target_layers": [0, 2, 5]}}, "layer_ids", "sglang-plus1"),
        ("d2t", {"drop": ("d2t",)}, "d2t", "d2t is missing"),
        ("offsets", {"d2t": "offsets"}, "d2t", "holds offsets"),
        ("beyond", {"d2t": "beyond"}, "d2t", "outside the target vocabulary"),
    ],
)
def test_each_broken_gguf_gets_its_error(made, target, name, change, code, words):
    src = made["ours"]
    if "d2t" in change:
        absolute = read_gguf_draft(src).d2t_absolute.numpy()
        bad = absolute - np.arange(absolute.size) if change["d2t"] == "offsets" else absolute + 256
        change = {"tensors": {"d2t": bad}}
    r, got = _got(rewrite(src, made["root"] / name / "d.gguf", **change), target)
    assert ("error", code) in got, r.to_json()
    assert any(words in f.what for f in r.findings if f.check == code), r.to_json()


def test_lost_norm_and_unimplemented_norm(made, target, tmp_path):
    for i, change in enumerate(
        ({"drop": ("eagle3.norm_before_residual",)}, {"set_keys": {"eagle3.norm_before_residual": False}})
    ):
        _, got = _got(rewrite(made["nbr"], tmp_path / str(i) / "d.gguf", **change), target)
        assert ("error", "norm_flags") in got
    path = rewrite(made["ours"], tmp_path / "fc" / "d.gguf", keep_contract=False)
    _side(made["ours"], path.parent, **{"norm.fc_norm": True})
    r, got = _got(path, target)
    assert ("error", "norm_flags") in got and "does not implement" in r.findings[0].what


def test_defaulted_ids_without_evidence_warn(made, target, tmp_path):
    path = rewrite(
        made["ours"], tmp_path / "w" / "d.gguf", set_keys={"eagle3.target_layers": [2, 4, 5]}, keep_contract=False
    )
    r, got = _got(path, target)
    assert got == {("warn", "layer_ids"), ("info", "contract")}, r.to_json()
    r, got = _got(path)  # no target, no target GGUF, no contract: the depth is unknown
    assert ("info", "layer_ids") in got


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"hidden": 96}, "wide"),
        ({"layers": 6}, "layer target"),
        ({"vocab": 300}, "vocabulary has"),
        ({"tokens": TOKENS[:-1] + ["other"]}, "vocabulary differs"),
    ],
)
def test_target_gguf_that_differs(made, tmp_path, kw, words):
    r, got = _got(made["ours"], None, target_gguf=fake_target_gguf(tmp_path / "t.gguf", **kw))
    assert ("error", "target") in got and any(words in f.what for f in r.findings), r.to_json()


def test_dflash_sliding_window(target, tmp_path):
    d, contract = build_dflash(target, taps=(1, 3, 6), block_size=4)
    path = export_gguf(d, contract, tmp_path / "e") / "draft.gguf"
    assert _got(path, target)[0].errors == 0
    _side(path, path.parent, **{"block.sliding_layers": [0], "block.sliding_window": 8})
    r, got = _got(path, target)
    assert ("error", "block") in got and "sliding window" in r.findings[0].what
    r = check(path, "llamacpp", target, measure=True)  # a block drafter's GGUF is measured as an EAGLE-3 one is
    assert r.measurement is not None and any(f.check == "measured_wiring" for f in r.findings), r.to_json()


def test_measurement_says_why_it_did_not_run(made, target, tmp_path):
    g = read_gguf_draft(made["ours"])
    q = g.tensors["blk.0.attn_q.weight"].numpy().copy()
    q[0, 0] = math.nan
    broken = rewrite(made["ours"], tmp_path / "nan" / "d.gguf", tensors={"blk.0.attn_q.weight": q})
    m, found = run_gguf_measurement(inspect_gguf(broken, target), target, chain_steps=1)
    assert m is None and found[0].level == "warn" and "does not load" in found[0].what
    bounds = sample_target(target, [torch.arange(1, 41, 2)], new_tokens=0, score_prompt=True)
    bounds = replace(bounds, labels=bounds.labels | 1)  # odd labels only: the draft's vocabulary (even ids) has none
    m, found = run_gguf_measurement(inspect_gguf(made["ours"], target), target, chain_steps=1, bounds=bounds)
    assert m is None and "nothing to measure" in found[0].what


def test_cli_checks_a_gguf_against_its_target_gguf(made):
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    bad = rewrite(made["ours"], made["root"] / "cli" / "d.gguf", set_keys={"eagle3.target_layers": [0, 2, 5]})
    r = CliRunner().invoke(
        app, ["doctor", str(bad), "--engine", "llamacpp", "--target-gguf", str(made["tg"]), "--json"]
    )
    assert r.exit_code == 1 and json.loads(r.stdout)["findings"][0]["check"] == "layer_ids", r.stdout
    r = CliRunner().invoke(app, ["doctor", str(made["ours"]), "--target-gguf", str(made["tg"])])  # detected
    assert r.exit_code == 0 and "0 error(s)" in r.stdout, r.stdout


def test_a_norm_an_older_release_does_not_read(target, tmp_path):
    """llama.cpp 0.3.30's eagle3.cpp reads norm_before_residual only: a norm_before_fc draft is wrong there."""
    draft, contract = build_draft(target, taps=(1, 3, 6), seed=4, norm=NormFlags(norm_before_fc=True))
    path = export_gguf(draft, contract, tmp_path / "e") / "draft.gguf"
    assert _got(path, target)[0].errors == 0
    r, got = _got(path, target, engine_version="0.3.30")
    assert ("error", "norm_flags") in got and "0.3.30 does not implement" in r.findings[0].what
