"""An SGLang release eaglewire has not read, between two it has: the rule of the read releases either side
where both read the architecture's ids through the same model file by the same rule (said in the rule's
description), a clear error naming both rules where they differ, and a release outside the read range refused
with a fix a user can act on. From the record alone (no wheels)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from eaglewire.errors import TranslationError
from eaglewire.export.engines import engine_for
from eaglewire.export.sglang_rules import NEWEST, RELEASES, neighbours, record, rule_for


def test_a_release_between_two_that_agree_applies_their_rule_and_says_so():
    rule = rule_for("LlamaForCausalLM", "0.5.20")
    assert rule.rule == "sglang-plus1" and rule.read_as == ("0.5.13", "0.5.23") and rule.release == "0.5.20"
    assert "0.5.20 not read" in rule.describe() and "agree for llama.py" in rule.describe()
    assert engine_for("sglang", "0.5.20").rule_note("LlamaForCausalLM") == rule.describe()


def test_a_release_between_two_that_disagree_is_an_error_naming_both():
    with pytest.raises(TranslationError) as err:  # gpt_oss.py: +1 in 0.5.13, keeps a final id in 0.5.23
        rule_for("GptOssForCausalLM", "0.5.20")
    assert (
        "sglang-plus1" in str(err.value) and "sglang-final" in str(err.value) and "--engine-version" in str(err.value)
    )


def test_a_release_outside_the_read_ones_is_refused_with_a_user_fix():
    with pytest.raises(TranslationError) as err:
        rule_for("LlamaForCausalLM", "0.6.1")
    assert f"--engine-version {NEWEST}" in str(err.value) and "RELEASES" not in str(err.value)
    with pytest.raises(TranslationError):
        rule_for("LlamaForCausalLM", "0.4.0")
    with pytest.raises(TranslationError):
        rule_for("LlamaForCausalLM", "latest")


@settings(max_examples=60, deadline=None)
@given(
    i=st.integers(0, len(RELEASES) - 2),
    patch=st.integers(0, 40),
    kind=st.sampled_from(["eagle3", "dflash"]),
    data=st.data(),
)
def test_every_unread_release_between_two_read_ones_follows_them(i, patch, kind, data):
    low, high = RELEASES[i], RELEASES[i + 1]
    base = Version(low).release
    version = f"{base[0]}.{base[1]}.{base[2] + 1 + patch % 9}"
    if not Version(low) < Version(version) < Version(high):
        return
    assert neighbours(version) == (low, high)
    archs = sorted({a for r in (low, high) for v in record()[kind][r].values() for a in v["archs"]})
    arch = data.draw(st.sampled_from(archs))

    def rule(release):
        try:
            r = rule_for(arch, release, kind)
            return (r.home, r.rule, r.via)
        except TranslationError:
            return None

    a, b = rule(low), rule(high)
    if a is not None and a == b:
        got = rule_for(arch, version, kind)
        assert (got.home, got.rule, got.via) == a and got.read_as == (low, high)
    else:
        with pytest.raises(TranslationError):
            rule_for(arch, version, kind)
