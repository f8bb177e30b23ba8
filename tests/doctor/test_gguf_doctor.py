"""The doctor on GGUF drafts (`eaglewire doctor DRAFT.gguf --engine llamacpp`): drafts made by llama.cpp's own
converter from our vLLM, SGLang and z-lab exports, and copies of them broken one knob at a time. Each finding fires on
its broken GGUF and not on the good one. (The property over every engine's numbering, and each finding one by
one — a lost norm, a target GGUF that differs — run on our own export's GGUF, which equals the converter's
(tests/export/test_llamacpp_converter.py): test_gguf_doctor_ours.py, test_gguf_findings.py.)"""

import numpy as np
import pytest
import torch
from llamacpp_gguf import VOCAB, convert, need_converter, rewrite, tiny_target
from tiny import build_dflash, build_draft

from eaglewire.api import check
from eaglewire.errors import CheckpointError
from eaglewire.export.convert import export_draft
from eaglewire.export.gguf_import import import_gguf
from eaglewire.export.gguf_read import read_gguf_draft
from eaglewire.norms import NormFlags

L, TAPS = 8, (1, 3, 6)  # taps the converter's default [2, 4, 5] does not hit


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Target, drafts, and the converter's GGUFs: from the vLLM export (ids kept), the SGLang export (ids
    nested: defaulted), a norm_before_residual draft's vLLM export, a DFlash draft's z-lab export, and the
    target itself."""
    need_converter()
    root = tmp_path_factory.mktemp("gguf")
    target = tiny_target(root / "target", layers=L)
    draft, contract = build_draft(target, taps=TAPS, seed=7, draft_vocab=VOCAB // 2)  # every even id
    nbr, nbr_contract = build_draft(
        target, taps=TAPS, seed=8, draft_vocab=VOCAB // 2, norm=NormFlags(norm_before_residual=True)
    )
    g = {}
    for name, d, c, fmt in (
        ("vllm", draft, contract, "vllm"),
        ("sglang", draft, contract, "sglang"),
        ("nbr", nbr, nbr_contract, "vllm"),
    ):
        g[name] = convert(export_draft(d, c, root / f"exp-{name}", fmt), root / "target", root / name / "d.gguf")
    block, block_contract = build_dflash(target, taps=TAPS, block_size=4)
    g["dflash"] = convert(
        export_draft(block, block_contract, root / "exp-zlab", "zlab"), root / "target", root / "dflash" / "d.gguf"
    )
    # the target's metadata and vocabulary as the converter writes them (its weights are not compared)
    g["target"] = convert(root / "target", root / "target", root / "tgt" / "target.gguf", "--vocab-only")
    return target, draft, g, root


def _findings(path, target=None, **kw):
    r = check(path, "llamacpp", target, measure=kw.pop("measure", False), **kw)
    return r, {(f.level, f.check) for f in r.findings}


def test_reader_gives_back_the_draft(made):
    target, draft, g, _ = made
    d = read_gguf_draft(g["vllm"])
    assert (d.family.family, d.target_layers, d.hidden_size) == ("eagle3", [1, 3, 6], 64)
    assert d.draft_vocab_size == VOCAB // 2
    model, _ = import_gguf(d.path, target=target)
    ours = draft.state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in model.state_dict().items())  # the converter's file, read back


def test_a_gguf_that_is_not_a_draft_is_refused(made):
    with pytest.raises(CheckpointError, match="architecture 'llama', not a draft"):
        read_gguf_draft(made[2]["target"])


def test_good_conversion_has_no_error(made):
    target, _, g, _ = made
    for name in ("vllm", "nbr"):
        r, _ = _findings(g[name], target, target_gguf=g["target"])
        assert r.errors == 0 and not [f for f in r.findings if f.level == "warn"], r.to_json()


def test_sglang_export_gets_the_defaulted_ids(made):
    target, _, g, root = made
    assert read_gguf_draft(g["sglang"]).target_layers == [2, 4, 5]  # the converter's silent default
    r, got = _findings(g["sglang"], target)
    assert ("error", "layer_ids") in got and "converter default" in r.findings[0].what
    bare = rewrite(g["sglang"], root / "bare" / "d.gguf", keep_contract=False)  # nothing else known: warn
    r, got = _findings(bare, target)
    assert ("warn", "layer_ids") in got and r.errors == 0


def test_d2t_missing_offsets_or_out_of_range(made):
    target, _, g, root = made
    absolute = read_gguf_draft(g["vllm"]).d2t_absolute.numpy()
    cases = {
        "missing": {"drop": ("d2t",)},
        "offsets": {"tensors": {"d2t": absolute - np.arange(absolute.size)}},
        "beyond": {"tensors": {"d2t": absolute + 49152 - absolute.max()}},
    }
    for name, change in cases.items():
        r, got = _findings(rewrite(g["vllm"], root / f"d2t-{name}" / "d.gguf", **change), target)
        assert ("error", "d2t") in got, name


def test_measured_wiring_reads_the_gguf(made):
    """Given the target, the GGUF's own weights are scored at what llama.cpp delivers and beside it."""
    target, _, g, _ = made
    r = check(g["sglang"], "llamacpp", target, measure=True)
    assert r.measurement["delivered"] == [2, 4, 5]
    assert any(f.check == "measured_wiring" for f in r.findings)


def test_dflash_from_a_zlab_export(made):
    """The converter adds 1 to z-lab's ids (output of layer k -> input of layer k+1): right for our z-lab
    export; the same ids left in z-lab's numbering are caught, as is a block size the draft was not trained with."""
    target, _, g, root = made
    d = read_gguf_draft(g["dflash"])
    assert d.family.family == "dflash" and d.target_layers == list(TAPS) and d.block_size == 4
    r, _ = _findings(g["dflash"], target, target_gguf=g["target"])
    assert r.errors == 0, r.to_json()
    zlab = rewrite(g["dflash"], root / "dz" / "d.gguf", set_keys={"dflash.target_layers": [t - 1 for t in TAPS]})
    r, got = _findings(zlab, target)
    assert ("error", "layer_ids") in got and "zlab" in r.findings[0].what
    _, got = _findings(rewrite(g["dflash"], root / "db" / "d.gguf", set_keys={"dflash.block_size": 16}), target)
    assert ("error", "block") in got
