"""The wiring contract: the one frozen record of how a draft is wired to its target.

Every artifact (capture dump, feature shard, checkpoint, export) carries a `WiringContract`, and every
loader compares the one it finds with the one it needs. This module is also the ONLY place that knows
how engines number layers: `_id_offset` holds the off-by-one, nothing else in eaglewire does. What boundaries
each convention can express (the table's ranges) are its records in conventions.py, which translation reads.

Canonical taps are residual-stream **boundaries** b in [0, L] of a target with L decoder layers:

    b = 0   embedding output (= input of decoder layer 0)
    b = k   output of decoder layer k-1 (= input of decoder layer k), un-normed residual stream
    b = L   output of the last decoder layer BEFORE the final norm

How engines write the same physical state (read from each engine's source; records in export/engines.py):

    convention      id written for boundary b        expressible b     why the range
    hf              b  (output_hidden_states index)   0 .. L-1          entry L is post-final-norm
    vllm            b                                 0 .. L            EagleModelMixin: before layer b,
    speculators     b                                 0 .. L              final boundary after the loop
    vllm-legacy     b                                 1 .. L-1          old loops add a None residual
                                                                          at 0, never see the end
    sglang-plus1    b - 1  (SGLang adds +1)           1 .. L-1          captured before layer id+1
    sglang-first1   b - 1 if b[0]==2, else b          1 .. L-1, b[0]!=1 PR #25454: +1 only if first id 1
    sglang-final    b - 1  (as is if max id = L)      1 .. L            gpt_oss.py: captures the end too
                    SGLang's rule is per model file and release: export/sglang_rules.py picks one of the three
                    for a target architecture (the engine names "sglang" and "sglang-legacy" are releases,
                    not rules: as conventions they are refused with that explanation)
    specforge       b - 1  (hook on layer id)         1 .. L            HF backend hooks layer id's output
                                                                          (SpecForge <= 0.1; 0.2 captures
                                                                          through SGLang: see the doctor)
    modelopt        b - 1  (hook on layer id)         1 .. L            forward hook = output of layer id
    eagle           hard-coded (2, L//2, L-3)         default only      SafeAILab EAGLE has no setting
    zlab            b - 1  (DFlash target_layer_ids)  1 .. L-1          reads HF hidden_states[id+1]
    sglang-dflash   b - 1  (SGLang adds +1 always)    1 .. L-1          set_dflash_layers_to_capture
    sglang-dflash-asis  b  (a model file keeps ids)   1 .. L-1          its setter keeps them: before layer id
    vllm-dflash     b - 1  (vLLM adds +1, PR #40727)  1 .. L            dflash_config.target_layer_ids
    deepspec        b - 1  (-1 = the embedding)       0 .. L-1          DeepSpec's target_layer_ids
    llamacpp        b  (GGUF <arch>.target_layers)    0 .. L-1          input of layer id; id L reads t_h_nextn

A draft's family (eagle3, dflash) and its block wiring are records of families.py; which engine field
carries a family's ids, in which of these conventions, is the engine record's `block_fields` (export/engines.py).

Taps are concatenated in ascending order by every engine, so a tap list must be strictly ascending.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from eaglewire.conventions import (  # each convention's record, read from the contract as before (re-exported)
    CANONICAL as CANONICAL,
    CONVENTIONS as CONVENTIONS,
    HOOKED as HOOKED,
    RETIRED as RETIRED,
    Convention as Convention,
    check_expressible,
    get_convention as get_convention,
)
from eaglewire.errors import ContractMismatch, TranslationError
from eaglewire.families import DEFAULT_FAMILY, BlockWiring, check_family_wiring
from eaglewire.norms import NormFlags
from eaglewire.taps import (
    default_taps as default_taps,
    validate_boundaries as validate_boundaries,
)  # importers read them here
from eaglewire.records import (
    build_exact_record as _build_exact,
    canonical_json,
    checked_record as _checked,
    flatten_dict as _flatten,
    sha256_text as sha256_text,  # importers read it from the contract
)

SCHEMA = "eaglewire.wiring/1"
CAPTURE_POINTS = ("residual_pre_norm",)  # the only capture point eaglewire produces
# How an inferred contract's taps were found: measured from the draft's weights (the doctor), or read from ids
INFERRED_SOURCES = ("measured", "engine_config")


# ---- the off-by-one and translation ---------------------------------------------------------------


def _id_offset(
    convention: str, values: Sequence[int], num_layers: int | None, direction: Literal["encode", "decode"]
) -> int:
    """THE off-by-one: engine id = boundary - offset. Nothing else in eaglewire shifts a layer id.

    `values` are the boundaries (encode) or the engine ids (decode); only SGLang's rules depend on them, and
    SGLang's rule is per model file (export/sglang_rules.py names the convention for an architecture and
    release): first1 adds 1 only when the first id is 1 (PR #25454), so taps starting at boundary 2 are
    written as ids starting at 1, which every SGLang model file reads the same; final keeps ids as they are
    when the last one is L (gpt_oss.py).
    """
    if convention in (
        "sglang-plus1",
        "specforge",
        "modelopt",
        "zlab",
        "sglang-dflash",
        "vllm-dflash",
        "deepspec",
    ):  # the last four: DFlash's "output of layer k"
        return 1
    if convention == "sglang-first1":
        return int(values[0] == (2 if direction == "encode" else 1))
    if convention == "sglang-final":
        if num_layers is None and direction == "decode":
            raise TranslationError(
                "sglang-final reads ids by the target's depth",
                expected="the number of layers",
                found="none",
                fix="pass --target (or --layers)",
            )
        return 1 if direction == "encode" else int(max(values) != num_layers)
    return 0


def to_engine(taps: Sequence[int], engine: str, num_layers: int) -> tuple[int, ...]:
    """Canonical boundaries -> the ids `engine` must be configured with to capture the same states."""
    conv = get_convention(engine)
    taps = validate_boundaries(taps, num_layers)
    check_expressible(conv, taps, num_layers)
    offset = _id_offset(engine, taps, num_layers, "encode")
    return tuple(b - offset for b in taps)


def from_engine(ids: Sequence[int], engine: str, num_layers: int) -> tuple[int, ...]:
    """Ids in `engine`'s convention -> canonical boundaries (validated and checked expressible)."""
    conv = get_convention(engine)
    ids = tuple(int(i) for i in ids)
    if not ids:
        raise TranslationError(f"empty {engine} layer-id list", expected="at least one id", found="[]")
    offset = _id_offset(engine, ids, num_layers, "decode")
    taps = validate_boundaries([i + offset for i in ids], num_layers)
    check_expressible(conv, taps, num_layers)
    return taps


def translate(ids: Sequence[int], source: str, target: str, num_layers: int) -> tuple[int, ...]:
    """Ids in convention `source` -> ids in convention `target` for the same physical states."""
    return to_engine(from_engine(ids, source, num_layers), target, num_layers)


def renumber(ids: Sequence[int], source: str, target: str, num_layers: int | None) -> tuple[int, ...]:
    """`translate` without its checks: also ids no engine accepts (outside the target, unsorted), as an engine
    reading a bad config delivers them, for the doctor to report. CANONICAL as `target`: the boundaries captured.
    `num_layers` may be None where the rules do not need it (all but sglang-final)."""
    ids = tuple(int(i) for i in ids)
    bounds = tuple(i + _id_offset(get_convention(source).name, ids, num_layers, "decode") for i in ids) if ids else ()
    return (
        tuple(b - _id_offset(get_convention(target).name, bounds, num_layers, "encode") for b in bounds) if ids else ()
    )


def misnumbered(taps: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`taps` one boundary late and one early: what a reader off by one delivers (the doctor scores both)."""
    return tuple(b + 1 for b in taps), tuple(b - 1 for b in taps)


def describe_boundary(b: int, num_layers: int) -> str:
    if b == 0:
        return "embedding output"
    if b == num_layers:
        return f"output of decoder layer {b - 1} (the last, before the final norm)"
    return f"output of decoder layer {b - 1}"


# ---- the contract ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetIdentity:
    """What a draft was built for. `name` is a label; the rest must match the target at load time."""

    name: str
    architecture: str
    config_sha256: str
    num_layers: int
    hidden_size: int
    vocab_size: int


@dataclass(frozen=True)
class WiringContract:
    """What a draft was trained against and every loader checks: the target, the tapped boundaries, the vocab map."""

    target: TargetIdentity
    taps: tuple[int, ...]
    capture: str = "residual_pre_norm"
    draft_vocab_size: int | None = None  # None until a vocab map exists (e.g. a bare capture dump)
    vocab_map_sha256: str | None = None
    chat_template_sha256: str | None = None
    norm: NormFlags = field(default_factory=NormFlags)
    schema: str = SCHEMA
    # The drafter family (families.FAMILIES) and, for a block drafter, its wiring. At their EAGLE-3 defaults
    # they are left out of the JSON, so every EAGLE-3 artifact reads and fingerprints as before they existed.
    family: str = DEFAULT_FAMILY
    block: BlockWiring | None = None
    # Set when the taps were not known from training but measured or read from an engine config (a draft
    # from another tool, `eaglewire import --target`): how, and the evidence. Provenance, not wiring: it is
    # outside equality, the fingerprint and `differences`, and absent from the JSON when None.
    inferred: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.inferred is not None and self.inferred.get("source") not in INFERRED_SOURCES:
            raise ContractMismatch(
                "an inferred contract must say how it was inferred",
                expected=f"inferred.source in {INFERRED_SOURCES}",
                found=repr(self.inferred.get("source")),
            )
        object.__setattr__(self, "taps", validate_boundaries(self.taps, self.target.num_layers))
        if self.capture not in CAPTURE_POINTS:
            raise ContractMismatch("unknown capture point", expected=" or ".join(CAPTURE_POINTS), found=self.capture)
        if self.schema != SCHEMA:
            raise ContractMismatch(
                "unsupported wiring-contract schema",
                expected=SCHEMA,
                found=self.schema,
                fix="re-create the artifact with this version of eaglewire",
            )
        check_family_wiring(self.family, self.block, self.target.vocab_size, self.norm.on)

    @classmethod
    def for_target(
        cls,
        identity: TargetIdentity,
        taps: Sequence[int],
        *,
        norm: NormFlags | None = None,
        vocab_map: Any | None = None,
        chat_template_sha256: str | None = None,
    ) -> "WiringContract":
        """The contract of a target (a loaded one, or one known from a dump): vocab_map is an
        eaglewire.draft.vocab.VocabMap once built, None before."""
        return cls(
            target=identity,
            taps=tuple(taps),
            norm=norm or NormFlags(),
            draft_vocab_size=vocab_map.draft_vocab_size if vocab_map is not None else None,
            vocab_map_sha256=vocab_map.sha256() if vocab_map is not None else None,
            chat_template_sha256=chat_template_sha256,
        )

    # ---- derived -------------------------------------------------------------------------------
    @property
    def num_taps(self) -> int:
        return len(self.taps)

    @property
    def tap_width(self) -> int:
        """Width of the concatenated tap tensor the draft's fc expects: n * H_target."""
        return self.num_taps * self.target.hidden_size

    def engine_ids(self, engine: str) -> tuple[int, ...]:
        return to_engine(self.taps, engine, self.target.num_layers)

    def fingerprint(self) -> str:
        return hashlib.sha256(canonical_json(self.wiring_dict()).encode()).hexdigest()[:16]

    # ---- JSON ----------------------------------------------------------------------------------
    def wiring_dict(self) -> dict[str, Any]:
        """The wiring fields only (what equality, the fingerprint and `differences` compare)."""
        d = dataclasses.asdict(self)
        d.pop("inferred")
        d["taps"] = list(self.taps)
        if self.family == DEFAULT_FAMILY and self.block is None:
            del d["family"], d["block"]
        elif self.block is not None:
            d["block"] = self.block.to_dict()
        return d

    def to_dict(self) -> dict[str, Any]:
        d = self.wiring_dict()
        if self.inferred is not None:
            d["inferred"] = self.inferred
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WiringContract":
        data = _checked("wiring contract", data, cls)
        data["target"] = _build_exact("wiring contract target", data["target"], TargetIdentity)
        data["norm"] = _build_exact("wiring contract norm", data["norm"], NormFlags)
        if data.get("block") is not None:
            data["block"] = BlockWiring.from_dict(data["block"])
        data["taps"] = tuple(data["taps"])
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "WiringContract":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ContractMismatch("wiring contract is not valid JSON", found=str(err)[:200]) from None
        return cls.from_dict(data)

    # ---- comparison ----------------------------------------------------------------------------
    def differences(self, other: "WiringContract", *, ignore: Sequence[str] = ()) -> list[tuple[str, Any, Any]]:
        """(field, self value, other value) for each differing leaf field, dotted names."""
        a, b = _flatten(self.wiring_dict()), _flatten(other.wiring_dict())
        return [
            (k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if k not in ignore and a.get(k) != b.get(k)
        ]

    def require_compatible(
        self, found: "WiringContract", *, where: str, ignore: Sequence[str] = ("target.name",)
    ) -> None:
        """Raise ContractMismatch naming every differing field (self = expected, found = artifact's)."""
        diffs = self.differences(found, ignore=ignore)
        if diffs:
            raise ContractMismatch(
                f"{where} was made for another wiring contract ({len(diffs)} field(s) differ)",
                expected="; ".join(f"{k}={v!r}" for k, v, _ in diffs),
                found="; ".join(f"{k}={w!r}" for k, _, w in diffs),
                fix="rebuild the artifact for this target/taps, or use the target it was made for",
            )

    def require_target(self, target: TargetIdentity, *, where: str) -> None:
        """Raise if `target` is not the model this contract was made for (name is only a label)."""
        mine, theirs = dataclasses.asdict(self.target), dataclasses.asdict(target)
        diffs = [(k, mine[k], theirs[k]) for k in mine if k != "name" and mine[k] != theirs[k]]
        if diffs:
            raise ContractMismatch(
                f"{where} was made for target {self.target.name!r}, not {target.name!r}",
                expected="; ".join(f"target.{k}={v!r}" for k, v, _ in diffs),
                found="; ".join(f"target.{k}={w!r}" for k, _, w in diffs),
                fix="use the target the draft was trained for, or train a draft for this target",
            )
