"""The doctor on GGUF drafts (`eaglewire doctor DRAFT.gguf --engine llamacpp`): drafts made by llama.cpp's own
converter from our vLLM and SGLang exports, and copies of them broken one knob at a time. Each finding fires on
its broken GGUF and not on the good one; a property test writes random taps in every engine's numbering."""

import json
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llamacpp_gguf import VOCAB, convert, need_converter, rewrite, tiny_target
from tiny import build_draft

from eaglewire.api import check
from eaglewire.contract import CANONICAL, CONVENTIONS, to_engine
from eaglewire.errors import CheckpointError, EaglewireError
from eaglewire.export.convert import export_draft
from eaglewire.export.gguf_read import load_gguf_eagle3, read_gguf_draft
from eaglewire.norms import NormFlags

L, TAPS = 8, (1, 3, 6)  # taps the converter's default [2, 4, 5] does not hit
KEY = "eagle3.target_layers"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Target, drafts, and the converter's GGUFs: from the vLLM export (ids kept), the SGLang export (ids
    nested: defaulted), a norm_before_residual draft's vLLM export, and the target itself."""
    need_converter()
    root = tmp_path_factory.mktemp("gguf")
    target = tiny_target(root / "target", layers=L)
    draft, contract = build_draft(target, taps=TAPS, seed=7, draft_vocab=VOCAB // 2)  # every even id
    nbr, nbr_contract = build_draft(target, taps=TAPS, seed=8, draft_vocab=VOCAB // 2, norm=NormFlags(norm_before_residual=True))
    g = {}
    for name, d, c, fmt in (("vllm", draft, contract, "vllm"), ("sglang", draft, contract, "sglang"),
                            ("nbr", nbr, nbr_contract, "vllm")):
        g[name] = convert(export_draft(d, c, root / f"exp-{name}", fmt), root / "target", root / name / "d.gguf")
    g["target"] = convert(root / "target", root / "target", root / "tgt" / "target.gguf")
    return target, draft, g, root


def _findings(path, target=None, **kw):
    r = check(path, "llamacpp", target, measure=kw.pop("measure", False), **kw)
    return r, {(f.level, f.check) for f in r.findings}


def test_reader_gives_back_the_draft(made):
    target, draft, g, _ = made
    d = read_gguf_draft(g["vllm"])
    assert (d.family.family, d.target_layers, d.hidden_size, d.draft_vocab_size) == ("eagle3", [1, 3, 6], 64, VOCAB // 2)
    model, _ = load_gguf_eagle3(d, target, TAPS)
    ours = draft.state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in model.state_dict().items())  # q/k un-permuted, d2t offsets


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


def test_lost_norm(made):
    target, _, g, root = made
    for i, change in enumerate(({"drop": ("eagle3.norm_before_residual",)},
                                {"set_keys": {"eagle3.norm_before_residual": False}})):
        _, got = _findings(rewrite(g["nbr"], root / f"norm{i}" / "d.gguf", **change), target)
        assert ("error", "norm_flags") in got


def test_d2t_missing_offsets_or_out_of_range(made):
    target, _, g, root = made
    absolute = read_gguf_draft(g["vllm"]).d2t_absolute.numpy()
    cases = {"missing": {"drop": ("d2t",)},
             "offsets": {"tensors": {"d2t": absolute - np.arange(absolute.size)}},
             "beyond": {"tensors": {"d2t": absolute + 49152 - absolute.max()}}}
    for name, change in cases.items():
        r, got = _findings(rewrite(g["vllm"], root / f"d2t-{name}" / "d.gguf", **change), target)
        assert ("error", "d2t") in got, name


def test_target_gguf_that_differs(made):
    target, _, g, root = made
    for i, key in enumerate(("llama.embedding_length", "llama.block_count", "llama.vocab_size")):
        tg = rewrite(g["target"], root / f"tg{i}" / "target.gguf", set_keys={key: 48})
        r, got = _findings(g["vllm"], None, target_gguf=tg)
        assert ("error", "target") in got or ("error", "layer_ids") in got, key


def test_measured_wiring_reads_the_gguf(made):
    """Given the target, the GGUF's own weights are scored at what llama.cpp delivers and beside it."""
    target, _, g, _ = made
    r = check(g["sglang"], "llamacpp", target, measure=True)
    assert r.measurement["delivered"] == [2, 4, 5]
    assert any(f.check == "measured_wiring" for f in r.findings)


@pytest.fixture(scope="module")
def small(made):
    """The vLLM conversion without its vocabulary's token texts (the property test rewrites it often)."""
    _, _, g, root = made
    return rewrite(g["vllm"], root / "small" / "d.gguf", drop=("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                               "tokenizer.ggml.token_type"))


TAP_SETS = st.lists(st.integers(1, L - 1), min_size=3, max_size=3, unique=True).map(lambda x: tuple(sorted(x)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(taps=TAP_SETS)
def test_every_other_numbering_is_flagged(made, small, tmp_path_factory, taps):
    """Random trained taps; the GGUF holds them in each engine's numbering: the doctor flags every list that
    llama.cpp reads as other boundaries, and passes the right one."""
    target = made[0]
    d = tmp_path_factory.mktemp("prop")
    side = json.loads((small.parent / "eaglewire_contract.json").read_text())
    (d / "eaglewire_contract.json").write_text(json.dumps({**side, "taps": list(taps)}))
    right = list(to_engine(taps, "llamacpp", L))
    written = {"llamacpp": right}
    for conv in CONVENTIONS:
        if conv in (CANONICAL, "llamacpp"):
            continue
        try:
            written[conv] = list(to_engine(taps, conv, L))
        except EaglewireError:
            continue  # this numbering cannot express the taps
    for conv, ids in written.items():
        path = rewrite(small, d / f"{conv}.gguf", set_keys={KEY: ids}, keep_contract=False)
        r, got = _findings(path, target)
        assert (("error", "layer_ids") in got) == (ids != right), (conv, ids, r.to_json())
        if conv == "sglang-plus1" and ids != right:
            assert "sglang-plus1" in next(f.what for f in r.findings if f.check == "layer_ids")
        path.unlink()
