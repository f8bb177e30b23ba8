"""SGLang's layer-id rules come from SGLang's own code: the released wheels of every verified release
(before, at and after PR #25454) are read, and every model file's real `set_eagle3_layers_to_capture` /
`set_dflash_layers_to_capture` runs on id lists (tests/sglang_code.py) against eaglewire's record and
translation. SGLang cannot be installed here (CUDA-only wheels), so nothing of it is imported: the setters are
extracted with `ast` and run on a stub model.

The wheels (~40 MB each) are downloaded by scripts/sglang_wheels.sh into the user cache; .ci/run calls it and
sets EAGLEWIRE_SGLANG_WHEELS, so in CI a missing wheel fails here rather than skipping.
"""

from __future__ import annotations

import itertools
import os
import zipfile
from pathlib import Path

import pytest
from sglang_code import MODELS, defining_classes, readings, run_setter, wheel_for

from eaglewire.contract import CONVENTIONS, from_engine, to_engine
from eaglewire.errors import TranslationError
from eaglewire.export.sglang_rules import (
    DELEGATES,
    DFLASH_CONVENTIONS,
    EAGLE3_RULES,
    RELEASES,
    dflash_boundaries,
    record,
    rule_for,
)

FOLDER = os.environ.get("EAGLEWIRE_SGLANG_WHEELS")
pytestmark = pytest.mark.skipif(not FOLDER, reason="set EAGLEWIRE_SGLANG_WHEELS (bash scripts/sglang_wheels.sh)")
# Files whose forward also captures after the last layer although the rule eaglewire records for them cannot
# name boundary L (always +1): eaglewire refuses that tap for them, a loss of reach, never a wrong tap.
FINAL_REACHABLE_BUT_REFUSED = {"minimax_m3.py"}


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    folder = Path(FOLDER or "")
    found = {r: wheel_for(folder, r) for r in RELEASES}
    missing = [r for r, w in found.items() if w is None]
    assert not missing, f"SGLang wheels {missing} are not in {folder}: run bash scripts/sglang_wheels.sh"
    return found  # type: ignore[return-value]


@pytest.fixture(scope="module")
def read(wheels) -> dict:
    return readings(Path(FOLDER or ""), RELEASES)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
@pytest.mark.parametrize("release", RELEASES)
def test_the_record_is_what_sglang_code_does(read, kind, release):
    """Every class that defines the setter, its rule and the architectures it serves, per release."""
    mine, theirs = record()[kind][release], read[kind][release]
    unknown = sorted(set(theirs) - set(mine))
    assert not unknown, f"SGLang {release} model files whose {kind} rule the record does not know: {unknown}"
    gone = sorted(set(mine) - set(theirs))
    assert not gone, f"the record lists {kind} setters SGLang {release} does not define: {gone}"
    wrong = {home: (mine[home], theirs[home]) for home in theirs if mine[home] != theirs[home]}
    assert not wrong, f"SGLang {release}: record vs SGLang's code (model file: (record, read)): {wrong}"


def _id_lists(L: int):
    values = range(L + 1) if L <= 8 else sorted({0, 1, 2, 3, 4, L // 2, L - 3, L - 2, L - 1, L})
    for n in (1, 2, 3):
        yield from (list(c) for c in itertools.combinations(values, n))


def _usable(captured: list[int], L: int, conv: str) -> bool:
    """A capture list the forward loop honours: states entering layers 1..L-1 (0 has no residual yet), and
    the end of the loop only where the file captures it."""
    return all(1 <= b < L or (b == L and CONVENTIONS[conv].reaches_final) for b in captured)


def _eagle3_homes(release: str):
    return [
        (home, v["rule"]) for home, v in record()["eagle3"][release].items() if v["archs"] and v["rule"] in EAGLE3_RULES
    ]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("L", [8, 30, 61])
def test_eaglewire_translation_is_what_each_sglang_setter_captures(wheels, release, L):
    """Both ways: ids eaglewire decodes are the boundaries SGLang's setter captures, ids it refuses SGLang
    would capture unusably; boundaries eaglewire writes are captured as written; and what no id list makes
    SGLang capture, eaglewire refuses to write."""
    sources = defining_classes(wheels[release])["set_eagle3_layers_to_capture"]
    for home, conv in _eagle3_homes(release):
        reachable = set()
        for ids in _id_lists(L):
            kind, got = run_setter(sources[home], ids, L)
            ok = kind == "capture" and _usable(got, L, conv)
            if ok:
                reachable.add(tuple(got))
            try:
                mine = from_engine(ids, conv, L)
            except TranslationError:
                assert not ok, f"SGLang {release} {home}: ids {ids} capture {got}, eaglewire ({conv}) refuses"
                continue
            assert ok and tuple(got) == mine, (
                f"SGLang {release} {home}: ids {ids} capture {got}, eaglewire ({conv}) says {list(mine)}"
            )
        for taps in _id_lists(L):
            try:
                ids = to_engine(taps, conv, L)
            except TranslationError:
                assert tuple(taps) not in reachable, f"SGLang {release} {home} can capture {taps}; {conv} refuses"
                continue
            assert run_setter(sources[home], list(ids), L) == ("capture", list(taps)), (release, home, taps, ids)


@pytest.mark.parametrize("release", RELEASES)
def test_final_boundary_reach_is_read_from_the_forward_loop(wheels, release):
    """sglang-final (gpt_oss.py) names boundary L because that file's forward captures after its last layer."""
    with zipfile.ZipFile(wheels[release]) as zf:
        for home, conv in _eagle3_homes(release):
            file = home.split(":")[0]
            src = zf.read(MODELS + file).decode()
            captures_end = "end_layer in self.layers_to_capture" in src
            if CONVENTIONS[conv].reaches_final:
                assert captures_end, f"SGLang {release} {file}: {conv} names boundary L, the forward never captures it"
            elif captures_end:
                assert file in FINAL_REACHABLE_BUT_REFUSED, f"SGLang {release} {file} captures boundary L: new reach"


@pytest.mark.parametrize("release", RELEASES)
def test_wrappers_hand_the_ids_to_the_model_named_in_their_source(wheels, release):
    with zipfile.ZipFile(wheels[release]) as zf:
        for kind in ("eagle3", "dflash"):
            for home, v in record()[kind][release].items():
                if v["rule"] == "delegate" and home in DELEGATES:
                    src = zf.read(MODELS + home.split(":")[0]).decode()
                    assert DELEGATES[home] in src, f"{home} does not build {DELEGATES[home]} in SGLang {release}"
                    assert rule_for(v["archs"][0], release, kind).via == home


@pytest.mark.parametrize("release", RELEASES)
def test_dflash_rules_are_what_each_sglang_setter_captures(wheels, release):
    """The DFlash table (for the DFlash family): ids -> boundaries under each served file's rule."""
    sources = defining_classes(wheels[release])["set_dflash_layers_to_capture"]
    L = 30
    checked = 0
    for home, v in record()["dflash"][release].items():
        if not v["archs"] or v["rule"] not in DFLASH_CONVENTIONS:
            continue  # wrappers resolve to the file they hand the ids to; other rules are refused by rule_for
        rule = rule_for(v["archs"][0], release, "dflash")
        assert rule.home == home
        for ids in ([1, 14, 26], [2, 15, 27], [0, 5, 10], [3, 16, 29]):
            kind, got = run_setter(sources[home], ids, L)
            try:
                mine = dflash_boundaries(ids, rule, L)
            except TranslationError:
                assert kind != "capture" or not all(1 <= b < L for b in got), (release, home, ids, got)
                continue
            assert kind == "capture" and tuple(got) == mine, (release, home, ids, got, mine)
            checked += 1
    assert checked


def test_the_seeds_case_through_the_real_rules(wheels):
    """A Kimi-K2.5-shaped target (DeepSeek-V3, 61 layers) through deepseek_v2.py and a Llama one (30 layers)
    through llama.py, default and non-default taps, in every verified release: the ids eaglewire writes are
    captured by SGLang's own setter as the taps."""
    cases = {
        "KimiK25ForConditionalGeneration": (61, [(2, 30, 58), (3, 30, 58), (1, 30, 60)]),
        "LlamaForCausalLM": (30, [(2, 15, 27), (3, 16, 29), (1, 16, 29)]),
    }
    for release in RELEASES:
        sources = defining_classes(wheels[release])["set_eagle3_layers_to_capture"]
        for arch, (L, tap_sets) in cases.items():
            rule = rule_for(arch, release)
            assert rule.model_file == ("llama.py" if arch.startswith("Llama") else "deepseek_v2.py"), rule
            for taps in tap_sets:
                try:
                    ids = to_engine(taps, rule.rule, L)
                except TranslationError:  # a first tap at boundary 1 under PR #25454's rule only
                    assert rule.rule == "sglang-first1" and taps[0] == 1
                    continue
                assert run_setter(sources[rule.home], list(ids), L) == ("capture", list(taps)), (release, arch, ids)
    kimi = rule_for("KimiK25ForConditionalGeneration")
    assert kimi.via.startswith("kimi_k25.py") and to_engine((3, 30, 58), kimi.rule, 61) == (3, 30, 58)
    assert to_engine((3, 30, 58), rule_for("KimiK25ForConditionalGeneration", "0.5.12.post1").rule, 61) == (2, 29, 57)
    assert to_engine((3, 16, 29), rule_for("LlamaForCausalLM").rule, 30) == (2, 15, 28)  # the ids
