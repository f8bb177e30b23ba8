"""Wiring contract: JSON round trip, strict parsing, and every layer-id translation both ways."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire.contract import (
    CANONICAL,
    CONVENTIONS,
    TargetIdentity,
    WiringContract,
    default_taps,
    from_engine,
    misnumbered,
    renumber,
    to_engine,
    translate,
)
from eaglewire.norms import NormFlags
from eaglewire.errors import ContractMismatch, TranslationError

LAYER_COUNTS = (4, 30, 61)


def _target(L: int = 30) -> TargetIdentity:
    return TargetIdentity(
        name="t",
        architecture="LlamaForCausalLM",
        config_sha256="ab" * 32,
        num_layers=L,
        hidden_size=576,
        vocab_size=49152,
    )


def test_contract_json_round_trip():
    c = WiringContract(
        target=_target(),
        taps=(2, 15, 27),
        draft_vocab_size=8000,
        vocab_map_sha256="cd" * 32,
        chat_template_sha256="ef" * 32,
        norm=NormFlags(norm_output=True),
    )
    again = WiringContract.from_json(c.to_json())
    assert again == c and again.fingerprint() == c.fingerprint()
    assert again.tap_width == 3 * 576 and again.engine_ids("vllm") == (2, 15, 27)


def test_contract_is_frozen_and_strict():
    c = WiringContract(target=_target(), taps=(2, 15, 27))
    with pytest.raises(AttributeError):
        c.taps = (1, 2, 3)  # type: ignore[misc]
    d = c.to_dict()
    d["aux_layer_ids"] = [1, 2, 3]
    with pytest.raises(ContractMismatch, match="unknown \\['aux_layer_ids'\\]"):
        WiringContract.from_dict(d)
    d = c.to_dict()
    del d["target"]["num_layers"]
    with pytest.raises(ContractMismatch, match="missing \\['num_layers'\\]"):
        WiringContract.from_dict(d)
    with pytest.raises(TranslationError, match="strictly ascending"):
        WiringContract(target=_target(), taps=(27, 2, 15))


def test_contract_differences_name_the_field():
    a = WiringContract(target=_target(), taps=(2, 15, 27))
    b = WiringContract(target=_target(), taps=(1, 15, 27))
    with pytest.raises(ContractMismatch, match=r"taps=\[2, 15, 27\]") as err:
        a.require_compatible(b, where="shard x")
    assert "taps=[1, 15, 27]" in str(err.value)
    other = TargetIdentity(**{**a.target.__dict__, "num_layers": 32, "name": "other"})
    with pytest.raises(ContractMismatch, match="target.num_layers=30") as err:
        a.require_target(other, where="checkpoint")
    assert "target.num_layers=32" in str(err.value)


@pytest.mark.parametrize(
    "L,conv,expected",
    [
        (30, "hf", (2, 15, 27)),
        (30, "vllm", (2, 15, 27)),
        (30, "speculators", (2, 15, 27)),
        (30, "vllm-legacy", (2, 15, 27)),
        (30, "sglang-first1", (1, 14, 26)),
        (30, "sglang-plus1", (1, 14, 26)),
        (30, "sglang-final", (1, 14, 26)),
        (30, "specforge", (1, 14, 26)),
        (30, "modelopt", (1, 14, 26)),
        (30, "eagle", (2, 15, 27)),
        (61, "sglang-first1", (1, 29, 57)),
        (61, "vllm", (2, 30, 58)),
        (61, "specforge", (1, 29, 57)),
    ],
)
def test_default_taps_per_engine(L, conv, expected):
    """Every engine's default lands on the same physical states: outputs of layers 1, L//2-1, L-4."""
    assert to_engine(default_taps(L), conv, L) == expected
    assert from_engine(expected, conv, L) == default_taps(L)


def test_default_taps_refused_for_shallow_target():
    with pytest.raises(TranslationError, match="L=4 gives boundaries \\[2, 2, 1\\]"):
        default_taps(4)


def test_sglang_rules_differ_off_the_default():
    # taps starting at boundary 3: the PR #25454 rule writes them raw, the always-+1 rule shifts by one.
    assert to_engine((3, 15, 27), "sglang-first1", 30) == (3, 15, 27)
    assert to_engine((3, 15, 27), "sglang-plus1", 30) == (2, 14, 26)
    # The same config list [2, 15, 27] means different layers under the two rules.
    assert from_engine((2, 15, 27), "sglang-first1", 30) == (2, 15, 27)
    assert from_engine((2, 15, 27), "sglang-plus1", 30) == (3, 16, 28)
    # ... and [1, 14, 26] means the same under all three.
    assert (
        from_engine((1, 14, 26), "sglang-first1", 30)
        == from_engine((1, 14, 26), "sglang-plus1", 30)
        == from_engine((1, 14, 26), "sglang-final", 30)
    )
    # gpt_oss.py keeps ids reaching L as they are; the final boundary is written as L-1 (+1 gives L too)
    assert from_engine((5, 10, 30), "sglang-final", 30) == (5, 10, 30)
    assert to_engine((5, 10, 30), "sglang-final", 30) == (4, 9, 29)


@pytest.mark.parametrize("name", ["sglang", "sglang-legacy"])
def test_sglang_names_without_a_rule_are_refused_with_the_way_out(name):
    with pytest.raises(TranslationError, match="names no single layer-id rule") as err:
        to_engine((2, 15, 27), name, 30)
    assert "--arch" in str(err.value)


@pytest.mark.parametrize(
    "conv,taps,match",
    [
        ("hf", (2, 15, 30), "AFTER the final norm"),
        ("sglang-first1", (0, 15, 27), "boundary 0 is the embedding"),
        ("sglang-first1", (2, 15, 30), "never after the last one"),
        ("sglang-first1", (1, 15, 27), "PR #25454"),
        ("sglang-plus1", (0, 15, 27), "embedding"),
        ("sglang-plus1", (2, 15, 30), "never after the last one"),
        ("sglang-final", (0, 15, 27), "embedding"),
        ("vllm-legacy", (2, 15, 30), "never after the last one"),
        ("specforge", (0, 15, 27), "embedding"),
        ("eagle", (3, 15, 27), "hard-codes"),
    ],
)
def test_impossible_translations_raise_with_reason(conv, taps, match):
    with pytest.raises(TranslationError, match=match) as err:
        to_engine(taps, conv, 30)
    assert conv in str(err.value) and "fix:" in str(err.value)


def test_vllm_reaches_embedding_and_final_boundary():
    assert to_engine((0, 15, 30), "vllm", 30) == (0, 15, 30)
    assert to_engine((2, 15, 30), "modelopt", 30) == (1, 14, 29)


def _expressible(conv: str, taps: tuple[int, ...], L: int) -> bool:
    c = CONVENTIONS[conv]
    if taps[0] < c.min_boundary or (taps[-1] == L and not c.reaches_final):
        return False
    if conv == "sglang-first1" and taps[0] == 1:
        return False
    if conv == "eagle":
        return L >= 8 and taps == default_taps(L)
    return True


@pytest.mark.parametrize("L", LAYER_COUNTS)
@pytest.mark.parametrize("conv", list(CONVENTIONS))
def test_every_translation_both_ways_small_sets(L, conv):
    """Exhaustive over all 1..3-tap lists for L=4; a spread of lists for L=30/61."""
    bounds = range(L + 1) if L == 4 else sorted({0, 1, 2, 3, L // 2, L - 3, L - 1, L})
    for n in (1, 2, 3):
        for taps in itertools.combinations(bounds, n):
            if _expressible(conv, taps, L):
                ids = to_engine(taps, conv, L)
                assert from_engine(ids, conv, L) == taps, (conv, taps, ids)
                assert translate(ids, conv, "boundary", L) == taps
            else:
                with pytest.raises(TranslationError):
                    to_engine(taps, conv, L)


@settings(max_examples=200, deadline=None)
@given(L=st.sampled_from(LAYER_COUNTS), data=st.data())
def test_any_to_any_translation_preserves_physical_states(L, data):
    taps = tuple(sorted(data.draw(st.sets(st.integers(0, L), min_size=1, max_size=4))))
    src, dst = data.draw(st.sampled_from(list(CONVENTIONS))), data.draw(st.sampled_from(list(CONVENTIONS)))
    if not (_expressible(src, taps, L) and _expressible(dst, taps, L)):
        return
    ids_src = to_engine(taps, src, L)
    assert from_engine(translate(ids_src, src, dst, L), dst, L) == taps


@settings(max_examples=300, deadline=None)
@given(L=st.sampled_from(LAYER_COUNTS), data=st.data())
def test_renumber_is_translate_without_its_checks(L, data):
    """Where translate accepts ids, renumber gives its answer; anywhere else (ids outside the target, unsorted,
    doubled) it still answers, and reading its answer back gives the ids: what an engine delivers from a bad config."""
    ids = data.draw(st.lists(st.integers(-2, L + 2), min_size=1, max_size=4))
    src, dst = data.draw(st.sampled_from(list(CONVENTIONS))), data.draw(st.sampled_from(list(CONVENTIONS)))
    try:
        want = translate(ids, src, dst, L)
    except TranslationError:
        want = None
    got = renumber(ids, src, dst, L)
    assert want is None or got == want
    bounds = renumber(ids, src, CANONICAL, L)
    assert len(bounds) == len(ids) and all(abs(b - i) <= 1 for b, i in zip(bounds, ids))
    if src not in ("sglang-first1", "sglang-final"):  # the value-free rules: one offset for every id, invertible
        assert renumber(bounds, CANONICAL, src, L) == tuple(ids)


def test_renumber_needs_the_depth_only_where_a_rule_reads_it():
    assert renumber([1, 14, 26], "sglang-dflash", CANONICAL, None) == (2, 15, 27)
    assert renumber([2, 15, 27], "speculators", "sglang-dflash", None) == (1, 14, 26)
    assert renumber([], "vllm", CANONICAL, None) == ()
    with pytest.raises(TranslationError, match="depth"):
        renumber([5, 10, 30], "sglang-final", CANONICAL, None)
    assert misnumbered((2, 15, 27)) == ((3, 16, 28), (1, 14, 26))


def test_cli_translate(tmp_path):
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    r = CliRunner().invoke(
        app, ["wiring", "translate", "--layers", "30", "--to", "sglang", "--arch", "LlamaForCausalLM", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ids"] == [1, 14, 26] and out["boundaries"] == [2, 15, 27] and out["to"] == "sglang-plus1"
    assert "llama.py" in out["to_rule"] and all(r["same"] for r in out["other_releases"].values())
    r = CliRunner().invoke(
        app,
        ["wiring", "translate", "-L", "30", "--taps", "1,14,26", "--from", "sglang-plus1", "--to", "vllm", "--json"],
    )
    assert json.loads(r.stdout)["ids"] == [2, 15, 27]
    r = CliRunner().invoke(
        app, ["wiring", "translate", "-L", "30", "--taps", "0,15,27", "--to", "sglang", "--arch", "LlamaForCausalLM"]
    )
    assert r.exit_code == 2 and "cannot express tap boundary 0" in r.output
    # without an architecture: ids every SGLang model file reads alike, or a refusal naming the way out
    r = CliRunner().invoke(app, ["wiring", "translate", "-L", "30", "--to", "sglang", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["ids"] == [1, 14, 26]
    r = CliRunner().invoke(app, ["wiring", "translate", "-L", "30", "--taps", "3,16,29", "--to", "sglang"])
    assert r.exit_code == 2 and "--arch" in r.output and "sglang-first1: [3, 16, 29]" in r.output


def test_cli_translate_for_the_embedded_target_is_what_llama_py_captures():
    """The issue's case: taps [3, 16, 29] for the embedded Llama target are ids [2, 15, 28], which SGLang's
    llama.py (+1 in every verified release) captures as boundaries [3, 16, 29]."""
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    r = CliRunner().invoke(
        app,
        [
            "wiring",
            "translate",
            "--layers",
            "30",
            "--to",
            "sglang",
            "--taps",
            "3,16,29",
            "--target",
            "smollm2-135m",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ids"] == [2, 15, 28] and out["architecture"] == "LlamaForCausalLM"
    assert out["to_rule"].endswith("llama.py (sglang-plus1)") and all(v["same"] for v in out["other_releases"].values())
