"""SGLang's layer-id rules, keyed by release and architecture (the engine record's SGLang part).

SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` (EAGLE-3) and a DFlash draft's target layer ids
through the target model's own `set_eagle3_layers_to_capture` / `set_dflash_layers_to_capture`, defined per
model file (`sglang/srt/models/*.py`), and the files disagree: llama.py and qwen*.py always add 1,
deepseek_v2.py adds 1 only when the first id is 1 since 0.5.13 (PR #25454), gpt_oss.py keeps ids that reach
the last layer since a later release, multimodal wrappers hand the ids to their language model. The setter
fills the model's `layers_to_capture`: k means the residual stream entering decoder layer k (boundary k in
eaglewire.contract's terms), captured in the model's forward loop before layer k runs.

sglang_rules.json is the record: per kind (eagle3, dflash) and release, each model file's class that defines
the setter, its rule and the architectures (config `architectures[0]`, SGLang's registry key) it serves.
tests/export/test_sglang_rules.py reads the same from SGLang's released wheels (downloaded by
scripts/sglang_wheels.sh) and runs every setter on id lists against eaglewire's translation, so a model file
whose rule the record does not know, or a rule that reads ids otherwise, fails there with its name.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from packaging.version import InvalidVersion, Version

from eaglewire.cache import cache_root
from eaglewire.contract import CANONICAL, renumber
from eaglewire.errors import TranslationError

RELEASES = ("0.5.12.post1", "0.5.13", "0.5.23")  # verified against their wheels; oldest first (0.5.13: PR #25454)
NEWEST = RELEASES[-1]
LEGACY_RELEASE = "0.5.12.post1"  # the newest release before PR #25454: what the `sglang-legacy` format means
WHEELS = cache_root() / "sglang-wheels"  # where scripts/sglang_wheels.sh downloads them
RECORD = Path(__file__).with_name("sglang_rules.json")
# A wrapper (multimodal, or a thin shell around a language model) hands the ids unchanged to the model it
# builds, named in its source: the architecture whose rule applies then.
DELEGATES = {
    "kimi_k25.py:KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM",
    "gemma3_mm.py:Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "mllama4.py:Llama4ForConditionalGeneration": "Llama4ForCausalLM",
    "nano_nemotron_vl.py:NemotronH_Nano_VL_V2": "NemotronHForCausalLM",
}
EAGLE3_RULES = ("sglang-plus1", "sglang-first1", "sglang-final")  # contract conventions, one per SGLang rule
# DFlash rules: the contract convention each names (dflash_boundaries reads config ids in it; the offset is contract's)
DFLASH_CONVENTIONS = {"sglang-plus1": "sglang-dflash", "as-is": "sglang-dflash-asis"}


@lru_cache(maxsize=1)
def record() -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(RECORD.read_text())
    return rec


@dataclass(frozen=True)
class SGLangRule:
    """What SGLang `release` does with a target of `architecture`'s layer ids (one kind: eagle3 or dflash)."""

    release: str
    architecture: str
    kind: str  # "eagle3" | "dflash"
    home: str  # "model_file.py:Class" whose setter runs
    rule: str  # eagle3: a contract convention (sglang-plus1 / -first1 / -final); dflash: a DFLASH_CONVENTIONS key
    via: str | None = None  # the wrapper whose setter handed the ids on, if any
    read_as: tuple[str, str] | None = None  # a release not read: the read releases either side, which agree

    @property
    def model_file(self) -> str:
        return self.home.split(":")[0]

    def describe(self) -> str:
        via = f" via {self.via.split(':')[0]}" if self.via else ""
        unread = (
            (
                f"; {self.release} not read, the rule of {self.read_as[0]} and {self.read_as[1]}, the read "
                f"releases either side, which agree for {self.model_file}"
            )
            if self.read_as
            else ""
        )
        return f"SGLang {self.release} {self.model_file}{via} ({self.rule}{unread})"


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def neighbours(version: str) -> tuple[str, str] | None:
    """The read releases just below and just above `version` (a release number between the oldest and the
    newest read), or None where it is read itself, outside that range, or not a release number."""
    v = _version(version)
    if version in RELEASES or v is None:
        return None
    below = [r for r in RELEASES if Version(r) < v]
    above = [r for r in RELEASES if Version(r) > v]
    return (below[-1], above[0]) if below and above else None


def check_release(version: str | None) -> str:
    """`version` (default: the newest read) where eaglewire can say how it reads layer ids: a read release, or
    one between two read releases (rule_for then applies their rule where they agree for the model file)."""
    version = version or NEWEST
    if version not in RELEASES and neighbours(version) is None:
        v = _version(version)
        newer = v is not None and v > Version(NEWEST)
        raise TranslationError(
            f"SGLang {version} is not a release eaglewire has read"
            + (f" and is newer than the newest read ({NEWEST})" if newer else ""),
            expected=f"a read release ({', '.join(RELEASES)}) or one between two of them",
            found=version,
            fix=(
                f"pass --engine-version {NEWEST} to apply the newest rules read "
                "after checking that your release's model file "
                "(sglang/srt/models/*.py) still sets the capture ids the same way"
                if newer
                else f"pass one of {', '.join(RELEASES)}"
            ),
        )
    return version


def _homes(kind: str, release: str) -> dict[str, dict[str, Any]]:
    homes: dict[str, dict[str, Any]] = record()[kind][release]
    return homes


def rule_for(architecture: str | None, release: str | None = None, kind: str = "eagle3") -> SGLangRule:
    """The rule SGLang `release` (default: the newest verified) applies to `architecture`'s layer ids. A
    release between two read ones gets their rule where both read the architecture's ids through the same
    model file by the same rule (said in `read_as` and describe()), else a clear error naming both."""
    release = check_release(release)
    if release not in RELEASES:
        return _between(architecture, release, kind)
    if not architecture:
        raise TranslationError(
            "SGLang's layer-id rule depends on the target's architecture",
            expected="an architecture (config.json `architectures[0]`)",
            found="none",
            fix="pass --arch ARCH or --target TARGET",
        )
    homes, via = _homes(kind, release), None
    for _ in range(3):  # a wrapper delegates at most once or twice
        home = next((h for h, v in homes.items() if architecture in v["archs"]), None)
        if home is None:
            known = sorted(a for v in homes.values() for a in v["archs"])
            raise TranslationError(
                f"SGLang {release} has no {kind} layer capture for {architecture}",
                expected=f"one of {len(known)} architectures, e.g. {', '.join(known[:6])}, ...",
                found=architecture,
                fix="serve the target on vLLM, or check its config's "
                "`architectures` (docs: guides/export.md, the SGLang rule table)",
            )
        rule = homes[home]["rule"]
        if rule != "delegate":
            if rule not in (EAGLE3_RULES if kind == "eagle3" else DFLASH_CONVENTIONS):
                raise TranslationError(
                    f"SGLang {release}'s {home} reads {kind} layer ids in a way eaglewire cannot translate",
                    expected=", ".join(EAGLE3_RULES),
                    found=rule,
                    fix="serve the target on vLLM, or on an SGLang release with a known rule",
                )
            return SGLangRule(release, architecture, kind, home, rule, via)
        if home not in DELEGATES:
            raise TranslationError(
                f"SGLang {release}'s {home} hands the ids to a model eaglewire has not read",
                expected="a wrapper listed in eaglewire.export.sglang_rules.DELEGATES",
                found=home,
                fix="serve the language model's own architecture, or add the "
                "wrapper to DELEGATES after reading its source",
            )
        via, architecture = home, DELEGATES[home]
    raise TranslationError("SGLang delegation loop", expected="a model that captures", found=architecture)


def _between(architecture: str | None, release: str, kind: str) -> SGLangRule:
    """An unread release between two read ones: their rule where they agree (vLLM's ranged rows do likewise)."""
    low, high = neighbours(release) or (NEWEST, NEWEST)
    a, b = rule_for(architecture, low, kind), rule_for(architecture, high, kind)
    if (a.home, a.rule, a.via) != (b.home, b.rule, b.via):
        raise TranslationError(
            f"SGLang {release} is not a release eaglewire has read, and the read releases either "
            f"side read {architecture}'s {kind} layer ids differently",
            expected=f"a release whose rule is known: {a.describe()} or {b.describe()}",
            found=release,
            fix=f"read your release's {a.model_file} (set_{kind}_layers_to_capture), "
            f"then pass --engine-version {low} or {high}, whichever it matches",
        )
    return dataclasses.replace(a, release=release, read_as=(low, high))


def used_rules(kind: str = "eagle3") -> tuple[str, ...]:
    """Every rule a served model file of a verified release applies (ids portable across SGLang agree on all)."""
    found = {v["rule"] for r in RELEASES for v in _homes(kind, r).values() if v["archs"]}
    return tuple(rule for rule in (EAGLE3_RULES if kind == "eagle3" else tuple(DFLASH_CONVENTIONS)) if rule in found)


def dflash_boundaries(ids: Sequence[int], rule: SGLangRule, num_layers: int) -> tuple[int, ...]:
    """The boundaries SGLang captures for DFlash target layer ids under `rule` (kind dflash)."""
    if rule.rule not in DFLASH_CONVENTIONS:
        raise TranslationError(
            f"{rule.describe()} captures DFlash layers in a way eaglewire cannot translate",
            expected=" or ".join(DFLASH_CONVENTIONS),
            found=rule.rule,
            fix="serve the target on another SGLang release or engine",
        )
    out = renumber(ids, DFLASH_CONVENTIONS[rule.rule], CANONICAL, num_layers)
    if any(not 1 <= b < num_layers for b in out):
        raise TranslationError(
            f"{rule.describe()} would capture boundaries {list(out)}",
            expected=f"boundaries in [1, {num_layers - 1}] (states entering a decoder layer)",
            found=str(list(out)),
            fix="choose DFlash target layers inside the target",
        )
    return out


def table() -> list[dict[str, Any]]:
    """One row per (kind, model file class, rule) with the releases it holds in: the docs' table."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for kind in ("eagle3", "dflash"):
        for release in RELEASES:
            for home, v in _homes(kind, release).items():
                rule = DELEGATES.get(home, v["rule"]) if v["rule"] == "delegate" else v["rule"]
                row = rows.setdefault(
                    (kind, home, rule), {"kind": kind, "home": home, "rule": rule, "releases": [], "archs": set()}
                )
                row["releases"].append(release)
                row["archs"] |= set(v["archs"])
    return sorted(rows.values(), key=lambda r: (r["kind"], r["home"], RELEASES.index(r["releases"][0])))
