"""The doctor on GGUF drafts written by our own `export --format llamacpp` (no converter needed): the id faults
as a property over random taps and every engine's numbering, DFlash's block knobs, and the wiring measured
from a trained draft's GGUF weights (the seeds' failures: SGLang numbering, the converter's default)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llamacpp_gguf import rewrite
from test_measured_wiring import TRAINED, bounds, target, trained  # noqa: F401  (the trained draft's fixtures)
from tiny import build_dflash, build_draft

from eaglewire.api import check
from eaglewire.contract import CANONICAL, CONVENTIONS, to_engine
from eaglewire.doctor.gguf_checks import gguf_layer_ids
from eaglewire.doctor.gguf_inspect import inspect_gguf
from eaglewire.doctor.gguf_measure import check_gguf, run_gguf_measurement
from eaglewire.errors import EaglewireError
from eaglewire.export.gguf_draft import export_gguf

L = 8


def _got(path, target=None, **kw):
    r = check(path, "llamacpp", target, measure=False, **kw)
    return r, {(f.level, f.check) for f in r.findings}


@pytest.fixture(scope="module")
def ours(target, tmp_path_factory):  # noqa: F811
    draft, contract = build_draft(target, taps=(1, 3, 6), seed=5)
    return export_gguf(draft, contract, tmp_path_factory.mktemp("ours") / "e") / "draft.gguf"


def test_our_export_is_healthy(target, ours):  # noqa: F811
    r, _ = _got(ours, target)
    assert r.errors == 0 and not [f for f in r.findings if f.level == "warn"], r.to_json()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(taps=st.lists(st.integers(0, L - 1), min_size=3, max_size=3, unique=True).map(lambda x: tuple(sorted(x))))
def test_every_other_numbering_is_flagged(target, ours, tmp_path_factory, taps):  # noqa: F811
    """Random trained taps (the contract beside the GGUF); target_layers written in each engine's numbering:
    the doctor flags every list llama.cpp reads as other boundaries, and passes the right one."""
    d = tmp_path_factory.mktemp("prop")
    side = json.loads((ours.parent / "eaglewire_contract.json").read_text())
    (d / "eaglewire_contract.json").write_text(json.dumps({**side, "taps": list(taps)}))
    right = list(to_engine(taps, "llamacpp", L))
    written = {"llamacpp": right}
    for conv in CONVENTIONS:
        if conv not in (CANONICAL, "llamacpp"):
            try:
                ids = list(to_engine(taps, conv, L))
            except EaglewireError:
                continue  # that numbering cannot express these taps
            if min(ids) >= 0:  # DeepSpec's -1 (the embedding) is no GGUF layer id
                written[conv] = ids
    for conv, ids in written.items():
        path = rewrite(ours, d / f"{conv}.gguf", set_keys={"eagle3.target_layers": ids}, keep_contract=False)
        r, got = _got(path, target)
        assert (("error", "layer_ids") in got) == (ids != right), (conv, ids, r.to_json())
        if ids != right:
            what = next(f.what for f in r.findings if f.check == "layer_ids")
            same = {c for c in written if written[c] == ids}  # numberings that write these taps the same way
            assert f"trained on {list(taps)}" in what and (
                any(c in what for c in same) or "converter default" in what
            ), what
        path.unlink()


def test_defaulted_ids_warn_without_evidence_and_pass_when_trained_there(target, tmp_path):  # noqa: F811
    draft, contract = build_draft(target, taps=(2, 4, 5), seed=5)  # trained on the default: right by coincidence
    good = export_gguf(draft, contract, tmp_path / "g") / "draft.gguf"
    assert _got(good, target)[0].findings == []
    (good.parent / "eaglewire_contract.json").unlink()
    r, got = _got(good, target)
    assert ("warn", "layer_ids") in got and r.errors == 0


@pytest.fixture(scope="module")
def dflash(target, tmp_path_factory):  # noqa: F811
    d, contract = build_dflash(target, taps=(1, 3, 6), block_size=4, causal=False)
    return export_gguf(d, contract, tmp_path_factory.mktemp("dflash") / "e") / "draft.gguf", contract


def test_dflash_block_knobs(target, dflash, tmp_path):  # noqa: F811
    path, contract = dflash
    assert _got(path, target)[0].errors == 0
    for i, change in enumerate(
        ({"dflash.block_size": 8}, {"tokenizer.ggml.mask_token_id": 3}, {"dflash.attention.causal": True})
    ):
        r, got = _got(rewrite(path, tmp_path / str(i) / "d.gguf", set_keys=change), target)
        assert ("error", "block") in got, (change, r.to_json())
    zlab = list(to_engine(contract.taps, "zlab", L))  # z-lab's numbering, not the converter's +1
    r, got = _got(rewrite(path, tmp_path / "z" / "d.gguf", set_keys={"dflash.target_layers": zlab}), target)
    assert ("error", "layer_ids") in got and "zlab" in r.findings[0].what


def test_measured_wiring_names_the_trained_boundaries(target, trained, bounds, tmp_path):  # noqa: F811
    """The seeds' failures in a GGUF, no contract beside it: SGLang's numbering, and the converter's default
    (an error once the weights say otherwise); the healthy GGUF measures clean."""
    draft, contract = trained
    base = export_gguf(draft, contract, tmp_path / "t") / "draft.gguf"
    (base.parent / "eaglewire_contract.json").unlink()
    for ids, level in ((list(TRAINED), "info"), ([1, 3, 5], "error"), ([2, 4, 5], "error")):
        path = rewrite(base, tmp_path / str(ids[0] + ids[2]) / "d.gguf", set_keys={"eagle3.target_layers": ids})
        gi = inspect_gguf(path, target)
        m, found = run_gguf_measurement(gi, target, chain_steps=2, bounds=bounds)
        assert found[0].level == level, (ids, m.to_dict())
        if ids != [2, 4, 5]:
            assert m.best == TRAINED, (ids, m.to_dict())
        else:  # the default: its +1 reading (3, 5, 6), a prior within this tiny target's margin of the trained
            assert m.best in (TRAINED, (3, 5, 6)) and m.clearly_worse, m.to_dict()  # set, may be named
            gi.measured = m  # and the static check turns its warning into an error
            assert gguf_layer_ids(gi)[0].level == "error"


def test_check_gguf_measures_by_default_only_without_contract(target, ours):  # noqa: F811
    assert check_gguf(ours, target).measurement is None  # the contract beside it is the truth
