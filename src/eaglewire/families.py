"""Drafter families as records: one `Family` per family, in one registry (`FAMILIES`), asked by every layer.

A family's record holds its wiring facts (here) and the parts each layer above contributes (`PARTS`: its strict
loader, its native checkpoint's tensors, its export formats, its training objective, its decoding, its benchmark
rows). This module sits low and imports nothing above it: each layer registers its part for the families it
implements (`register_part`, at import of the module that defines the part), and asks `get_family(name).part(kind)`
instead of keeping a table keyed by the name. A new family is one `register_family(Family(...), **parts)` in
its own module. How an engine numbers a family's taps is the engine's record (export/engines.py), never the
family's. Nothing here shifts a layer id: contract.py's `_id_offset` holds every off-by-one.

DFlash (z-lab, arXiv 2602.06036) drafts a whole block in one non-causal pass: slot 0 holds the anchor (the
token the target just emitted), slots 1..B-1 hold the mask token, and slot k predicts position p+k (anchor
layout "bonus", B-1 drafts per round; DSpark's "anchor_first" predicts p+k+1, B drafts). The context (the
target's tapped states of every earlier position) enters each draft layer as extra keys/values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from eaglewire.errors import ContractMismatch
from eaglewire.safeio import check_dataclass_fields

ANCHOR_LAYOUTS = ("bonus", "anchor_first")
ROPE_STYLES = ("neox",)  # rotate-half, what z-lab's checkpoints, SGLang and vLLM (default is_neox_style) use
FULL, SLIDING = "full_attention", "sliding_attention"  # HF `layer_types` values


@dataclass(frozen=True)
class BlockWiring:
    """What a block drafter and every engine serving it must agree on, beyond the taps.

    Attention: every query of a block sees all earlier context; `sliding_attention` layers (indices in
    `sliding_layers`) see only the last `sliding_window` positions. Inside the block a `full_attention` layer
    is bidirectional and a sliding one causal (z-lab's, SpecForge's and vLLM's default), unless `causal` says
    otherwise for every layer, as vLLM's `dflash_config.causal` does (vLLM 0.32 qwen3_dflash.py
    `_dflash_layer_causal`; its speculators updater writes causal=False).
    """

    block_size: int  # B: tokens per draft pass, the anchor included
    mask_token_id: int  # a row of the target's embedding that fills slots 1..B-1
    anchor_layout: str = "bonus"  # "bonus": slot k predicts p+k (B-1 drafts); "anchor_first": p+k+1 (B drafts)
    rope_style: str = "neox"
    causal: bool | None = None  # None: per layer type; True / False: every layer (vLLM's dflash_config.causal)
    sliding_layers: tuple[int, ...] = ()  # draft layers of type sliding_attention; the rest are full_attention
    sliding_window: int | None = None  # positions a sliding layer sees (required iff sliding_layers)

    POSITIVE_FIELDS = ("block_size",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))
        problems = []
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            problems.append(("block_size", ">= 2 (the anchor and at least one mask slot)", repr(self.block_size)))
        if isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            problems.append(("mask_token_id", "a token id >= 0", repr(self.mask_token_id)))
        if self.anchor_layout not in ANCHOR_LAYOUTS:
            problems.append(("anchor_layout", " or ".join(ANCHOR_LAYOUTS), repr(self.anchor_layout)))
        if self.rope_style not in ROPE_STYLES:
            problems.append(("rope_style", " or ".join(ROPE_STYLES), repr(self.rope_style)))
        s = self.sliding_layers
        if any(i < 0 for i in s) or any(a >= b for a, b in zip(s, s[1:])):
            problems.append(("sliding_layers", "distinct ascending draft-layer indices >= 0", str(list(s))))
        if bool(s) != (self.sliding_window is not None) or (
            self.sliding_window is not None and self.sliding_window < 1
        ):
            problems.append(
                (
                    "sliding_window",
                    "a window >= 1 exactly when sliding_layers is non-empty",
                    f"sliding_window={self.sliding_window!r}, sliding_layers={list(s)}",
                )
            )
        if problems:
            raise ContractMismatch(
                "invalid block-drafter wiring",
                expected="; ".join(f"{k}: {e}" for k, e, _ in problems),
                found="; ".join(f"{k}={f}" for k, _, f in problems),
            )

    # ---- derived -------------------------------------------------------------------------------
    @property
    def drafts_per_round(self) -> int:
        """Tokens one draft pass proposes: B-1 ("bonus": slot 0 is the anchor) or B ("anchor_first")."""
        return self.block_size - 1 if self.anchor_layout == "bonus" else self.block_size

    @property
    def label_offset(self) -> int:
        """Slot k of a block anchored at p predicts position p + k + label_offset."""
        return 0 if self.anchor_layout == "bonus" else 1

    def layer_types(self, num_layers: int) -> tuple[str, ...]:
        """HF `layer_types` of a draft with `num_layers` layers."""
        if self.sliding_layers and self.sliding_layers[-1] >= num_layers:
            raise ContractMismatch(
                "sliding layer index beyond the draft's layers",
                expected=f"indices < {num_layers}",
                found=str(list(self.sliding_layers)),
            )
        return tuple(SLIDING if i in self.sliding_layers else FULL for i in range(num_layers))

    def require_vocab(self, vocab_size: int) -> None:
        if not self.mask_token_id < vocab_size:
            raise ContractMismatch(
                "the mask token is not a row of the target's embedding",
                expected=f"mask_token_id < {vocab_size}",
                found=str(self.mask_token_id),
                fix="pick an unused or reserved id of the target's vocabulary",
            )

    # ---- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sliding_layers"] = list(self.sliding_layers)
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "BlockWiring":
        if not isinstance(data, dict):
            raise ContractMismatch("block wiring must be a JSON object", expected="{...}", found=type(data).__name__)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown, missing = sorted(data.keys() - names), sorted({"block_size", "mask_token_id"} - data.keys())
        if unknown or missing:
            raise ContractMismatch(
                "block wiring has the wrong fields",
                expected=f"fields {sorted(names)}",
                found=f"unknown {unknown}, missing {missing}",
                fix="the artifact was written by another tool or version; re-create it",
            )
        check_dataclass_fields(data, cls, where="block wiring", error=ContractMismatch)
        return cls(**{**data, "sliding_layers": tuple(data.get("sliding_layers", ()))})


# ---- engine fields: where an engine reads a block family's taps, in which layer-id convention --------------
# The rows live in each engine's record (export/engines.py `Engine.block_fields`): the engine record is the one
# place that says how it numbers a family's taps. This class sits here, low, so that records of every layer
# above can name it.


@dataclass(frozen=True)
class EngineField:
    engine: str  # the `--to` name of `wiring translate --family` (an engine, or the layout it reads: speculators)
    field: str  # the config field the ids are written to
    convention: str  # a contract.CONVENTIONS name: how that field numbers a boundary
    note: str  # what the engine does with it (read from its code; the source names where)
    source: str
    family: str = "dflash"  # the drafter family whose taps the field carries


# The parts a layer above registers for a family, and who registers them (the layer asks the record for it).
PARTS = {
    "load_strict": "draft/load.py: the strict loader of renamed tensors (load_strict's arguments) -> the draft",
    "checkpoint_state": "export/checkpoint.py: (draft, contract, save_embedding) -> the tensors a native "
    "checkpoint holds",
    "block_formats": "export/block.py: its export formats by name (a block family)",
    "objective": "train/objectives.py: its training Objective",
    "decoding": "drafters.py: its Decoding (proposer, export layout, default tree)",
    "bench_rows": "serve/bench.py: the benchmark rows that decode with its draft",
}


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    block: bool  # True: the contract carries a BlockWiring
    title: str = ""  # how reports name the family
    vllm_method: str = ""  # vLLM's speculative_config "method"
    sglang_algorithm: str = ""  # SGLang's --speculative-algorithm
    llamacpp_spec_type: str = ""  # llama-server's --spec-type (common/speculative.cpp's names)
    # what each layer registered (PARTS); not part of the record's identity
    parts: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def part(self, kind: str) -> Any:
        """The `kind` part (PARTS) a layer registered for this family; a clear error where none did."""
        if kind not in PARTS:
            raise KeyError(f"{kind!r} is not a family part ({', '.join(PARTS)})")
        if kind not in self.parts:
            raise ContractMismatch(
                f"the {self.name} family has no {kind}",
                expected=PARTS[kind],
                found=f"parts {sorted(self.parts)}",
                fix="use a version of eaglewire that implements it for this family",
            )
        return self.parts[kind]

    def has(self, kind: str) -> bool:
        return kind in self.parts


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "eagle3",
            "EAGLE-3: a chain/tree drafter fed fused taps and its own hidden state",
            False,
            title="EAGLE-3",
            vllm_method="eagle3",
            sglang_algorithm="EAGLE3",
            llamacpp_spec_type="draft-eagle3",
        ),
        Family(
            "dflash",
            "DFlash: a block drafter, one non-causal pass over [anchor, MASK x (B-1)]",
            True,
            title="DFlash",
            vllm_method="dflash",
            sglang_algorithm="DFLASH",
            llamacpp_spec_type="draft-dflash",
        ),
    ]
}
DEFAULT_FAMILY = "eagle3"


def register_family(family: Family, **parts: Any) -> Family:
    """Make `family` known (a contract may name it) with the parts given; the record for its name."""
    if family.name in FAMILIES:
        raise ValueError(f"drafter family {family.name!r} is registered already")
    FAMILIES[family.name] = family
    for kind, value in parts.items():
        register_part(family.name, kind, value)
    return family


def unregister_family(name: str) -> None:
    """Forget a family registered by `register_family` (tests' toy families)."""
    FAMILIES.pop(name, None)


def register_part(family: str, kind: str, value: Any) -> None:
    """Layer code registers its `kind` part (PARTS) of `family`: the record then answers for it."""
    if kind not in PARTS:
        raise KeyError(f"{kind!r} is not a family part ({', '.join(PARTS)})")
    get_family(family).parts[kind] = value


def families_with(kind: str) -> tuple[Family, ...]:
    """Every registered family that has a `kind` part."""
    return tuple(f for f in FAMILIES.values() if f.has(kind))


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ContractMismatch(
            f"unknown drafter family {name!r}",
            expected=" / ".join(FAMILIES),
            found=repr(name),
            fix="re-create the artifact with a version of eaglewire that knows this family",
        )
    return FAMILIES[name]


def check_family_wiring(family: str, block: BlockWiring | None, vocab_size: int, norm_on: frozenset[str]) -> None:
    """A contract's family fields agree: the family is known, a block family has block wiring (and only it),
    the mask token is a row of the target's embedding, and no EAGLE-3 norm flag is set on a block drafter."""
    fam = get_family(family)
    if fam.block != (block is not None):
        raise ContractMismatch(
            f"a {fam.name} contract {'needs' if fam.block else 'has no'} block wiring",
            expected="block wiring" if fam.block else "block=None",
            found=repr(block),
            fix="re-create the artifact",
        )
    if block is not None:
        block.require_vocab(vocab_size)
        if norm_on:  # the norm flags are an EAGLE-3 knob; no block drafter reads them
            raise ContractMismatch(
                f"norm flags on a {fam.name} contract",
                expected="no norm flag set",
                found=str(sorted(norm_on)),
                fix="drop --norms for a block drafter",
            )


def zlab_default_ids(num_layers: int, num_taps: int) -> tuple[int, ...]:
    """z-lab's `build_target_layer_ids` (also SpecForge's and SGLang's fallback when a config has no ids):
    `num_taps` ids spread evenly over [1, L-3] with Python's round, in the zlab convention (id k = output of
    layer k); [L//2] for one tap. Convert with contract.from_engine(ids, "zlab", L)."""
    if num_taps == 1:
        return (num_layers // 2,)
    start, end = 1, num_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps))
