"""The one loader (eaglewire.compose.load_draft, `ew.load_draft`): any draft of any registered family, written in
any of its layouts, loads back as the same weights with the same contract inside, its layout detected; an
export without its contract file gets the same wiring back from the config's ids, marked as inferred.

The families and their layouts are asked of the registry (families.py, the engine records), so a family or a
layout registered later is covered by the same property without an edit here."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from tiny import VOCAB, build_dflash, build_draft, build_target

import eaglewire as ew
from eaglewire.compose import EAGLE3, GGUF_ENGINE, draft_layout, load_draft
from eaglewire.contract import default_taps
from eaglewire.errors import EaglewireError
from eaglewire.export.base import CONTRACT_FILE
from eaglewire.export.convert import export_draft
from eaglewire.export.engines import ENGINE_FORMATS, NATIVE
from eaglewire.families import FAMILIES, families_with
from eaglewire.norms import NormFlags

L = 8


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=L)


def _layouts(family) -> tuple[str, ...]:
    """Every layout a draft of `family` is written in: native, the GGUF, and the family's own export formats
    (a block family's are its record's block_formats part, any other's the engine layouts)."""
    own = tuple(family.part("block_formats")) if family.has("block_formats") else ENGINE_FORMATS
    return tuple(dict.fromkeys((NATIVE, GGUF_ENGINE, *own)))


FAMILY_LAYOUTS = [(f.name, fmt) for f in families_with("decoding") for fmt in _layouts(f)]


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@st.composite
def drafts(draw, target, family: str):
    """A random small draft of `family` (tests/tiny.py's builders): a block family's from build_dflash, any
    other's from build_draft; its taps the engines' defaults or any boundaries."""
    seed = draw(st.integers(0, 2**16))
    if FAMILIES[family].block:
        taps = tuple(sorted(draw(st.lists(st.integers(1, L - 1), min_size=1, max_size=4, unique=True))))
        return build_dflash(
            target,
            taps=taps,
            block_size=draw(st.integers(2, 9)),
            layers=draw(st.integers(1, 2)),
            vocab_every=draw(st.sampled_from([None, 2])),
            seed=seed,
            mask_token_id=draw(st.integers(0, VOCAB - 1)),
        )
    taps = draw(
        st.one_of(
            st.just(default_taps(L)),
            st.lists(st.integers(0, L - 1), min_size=3, max_size=3, unique=True).map(lambda t: tuple(sorted(t))),
        )
    )
    norm = draw(st.sampled_from([NormFlags(), NormFlags(norm_before_fc=True), NormFlags(norm_before_residual=True)]))
    return build_draft(target, taps=taps, seed=seed, norm=norm, draft_vocab=draw(st.sampled_from([32, 128])))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(data=st.data(), which=st.sampled_from(FAMILY_LAYOUTS))
def test_every_family_in_every_layout_loads_back_as_it_was(tmp_path_factory, target, data, which):
    family, fmt = which
    draft, contract = data.draw(drafts(target, family), label="draft")
    try:
        out = export_draft(draft, contract, tmp_path_factory.mktemp(fmt), fmt)
    except EaglewireError:  # a layout that cannot hold this draft refuses it (tested in tests/export/)
        reject()
    _loads_back(out, target, draft, contract, family, fmt)


@pytest.mark.parametrize("family,fmt", FAMILY_LAYOUTS)
def test_a_plain_draft_of_every_family_loads_back_from_every_layout(tmp_path, target, family, fmt):
    """The property's pairs each hold at least the plainest draft (the engines' default taps, no extra norm):
    none of them is only ever refused, so none is skipped by every example above."""
    block = FAMILIES[family].block
    draft, contract = build_dflash(target, taps=(1, 4, 7)) if block else build_draft(target, taps=default_taps(L))
    _loads_back(export_draft(draft, contract, tmp_path / fmt, fmt), target, draft, contract, family, fmt)


def _loads_back(out, target, draft, contract, family: str, fmt: str) -> None:
    assert contract.family == family, f"tests/tiny.py built a {contract.family} draft for the {family} family"
    back = load_draft(out, target)  # the layout detected
    assert draft_layout(out) == fmt or _same(load_draft(out, target, fmt=draft_layout(out)), back)
    assert _same(draft, back) and back.contract == contract and back.contract.inferred is None
    assert back.contract.family == family
    if contract.block is not None:  # the block lives in the contract only: the draft reads it there
        assert back.block is back.contract.block
    if fmt == NATIVE:
        return
    (out.parent / CONTRACT_FILE if out.suffix == ".gguf" else out / CONTRACT_FILE).unlink()
    again = load_draft(out, target, fmt=fmt)  # another tool's export: the contract rebuilt from its ids
    assert _same(draft, again) and again.contract == contract
    assert again.contract.inferred is not None and again.contract.inferred["source"] == "engine_config"
    assert again.contract.inferred["engine"] == fmt
    with pytest.raises(EaglewireError):  # no target to rebuild it on: refused, never guessed
        load_draft(out, None, fmt=fmt)


def test_every_layout_is_covered():
    """The property above draws from every (family, layout) pair the registry knows: both families, and each
    in native, GGUF and its own formats (a family or layout registered later is drawn too)."""
    names = {f for f, _ in FAMILY_LAYOUTS}
    assert {EAGLE3, "dflash"} <= names
    assert {(EAGLE3, f) for f in (NATIVE, GGUF_ENGINE, "sglang", "vllm", "specforge", "eagle")} <= set(FAMILY_LAYOUTS)
    assert {("dflash", f) for f in (NATIVE, GGUF_ENGINE, "zlab", "sglang", "vllm")} <= set(FAMILY_LAYOUTS)


def test_the_front_door_is_the_one_loader():
    """`ew.load_draft` is compose.load_draft itself (one function), and it returns the draft alone."""
    assert ew.load_draft is load_draft
    draft = ew.load_draft(None)  # the released draft: its contract inside
    assert not isinstance(draft, tuple) and draft.contract is not None
