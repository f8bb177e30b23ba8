"""One record per engine (version): how it names, wires and runs an EAGLE-3 draft.

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
from typing import Any

from eaglewire.errors import CheckpointError
from eaglewire.export.sglang_rules import LEGACY_RELEASE
from eaglewire.export.sglang_rules import SGLangRule, check_release, rule_for
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

    def convention_for(self, architecture: str | None) -> str:
        """The layer-id convention (eaglewire.contract) of the ids this engine reads for such a target."""
        rule = self.rule(architecture)
        return rule.rule if rule is not None else self.convention

    def rule_note(self, architecture: str | None) -> str:
        """Which rule applied, for messages: "SGLang 0.5.23 llama.py (sglang-plus1)", "" for fixed rules."""
        rule = self.rule(architecture)
        return rule.describe() if rule is not None else ""


_SGLANG: dict[str, Any] = dict(config_style="eagle3", id_keys=(NESTED_IDS_KEY,), prefix0="midlayer.", layer0_prefixes=("midlayer.",),
               multi_layer=False, norms=frozenset({"fc_norm", "norm_output"}), replaces_embedding=True,
               skips_unknown_keys=True, tied_head_from_embedding=True)

ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine(SGLANG, SGLANG, **_SGLANG),  # the rule is per model file and release: export/sglang_rules.py
    # SGLang as it was before PR #25454 (the newest such release verified): every model file adds 1
    Engine("sglang-legacy", SGLANG, **_SGLANG, release=LEGACY_RELEASE),
    Engine("vllm", "vllm", "speculators", (IDS_KEY, NESTED_IDS_KEY), "layers.0.", ("layers.0.", "midlayer."),
           multi_layer=True, norms=ALL_NORMS, replaces_embedding=False, skips_unknown_keys=False),
    Engine("eagle", "eagle", "llama", (), "midlayer.", ("midlayer.",), multi_layer=False, norms=frozenset(),
           replaces_embedding=False, skips_unknown_keys=True, embedding_needed_if_resized=True),  # SafeAILab EAGLE
    Engine("specforge", "specforge", "eagle3", (NESTED_IDS_KEY,), "midlayer.", ("midlayer.",), multi_layer=False,
           norms=frozenset({"fc_norm"}), replaces_embedding=True, skips_unknown_keys=True,
           tied_head_from_embedding=True, num_taps=3, norm_output_is_final_norm=True,
           other_version=OtherReading(SGLANG, "when hooked on layer outputs (SpecForge <= 0.1)",
                                      "when captured through SGLang (SpecForge 0.2)",
                                      "the same config taps other layers depending on SpecForge's capture backend",
                                      "train taps starting at boundary 2 (ids starting at 1 read the same in both)")),
    # llama.cpp (GGUF, export/llamacpp_layout.py): the input of layer id, exactly 3 taps and 1 layer (eagle3.cpp),
    # d2t kept (absolute ids), t2d dropped; its own token_embd if the file has one, else the target's
    Engine("llamacpp", "llamacpp", gguf_layout.STYLE, (gguf_layout.EAGLE3.key(gguf_layout.TARGET_LAYERS),), "blk.0.",
           ("blk.0.",), multi_layer=False, norms=gguf_layout.EAGLE3.norms, replaces_embedding=False,
           skips_unknown_keys=False, num_taps=3, release=gguf_layout.NEWEST),
)}
ALIASES = {"speculators": "vllm"}  # the speculators format is what vLLM loads
ENGINE_FORMATS = (*ENGINES, *ALIASES)  # every name `--engine` and the run config's `formats` accept
NATIVE = "native"  # eaglewire's own checkpoint (eaglewire.export.checkpoint): a format with no engine behind it
FORMATS = (NATIVE, *ENGINE_FORMATS)  # every name `eaglewire export` / `import --format` accept


def engine_for(name: str, version: str | None = None) -> Engine:
    """The record for an engine or format name (aliases resolved); `version`: the engine release (SGLang)."""
    record = ENGINES.get(ALIASES.get(name, name))
    if record is not None and version is not None:
        if record.per_model_file:  # other engines' rules hold for every release: the version is a label there
            check_release(version)
        if record.config_style == gguf_layout.STYLE:  # llama.cpp: what each release reads (llamacpp_layout.py)
            record = dataclasses.replace(record, norms=gguf_layout.release(version).eagle3_norms)
        record = dataclasses.replace(record, release=version)
    if record is None:
        fix = ("native is eaglewire's own checkpoint, not an engine: name the engine that will load the draft"
               if name == NATIVE else "pick one of the names listed")
        raise CheckpointError(f"unknown engine or format {name!r}", expected=", ".join(ENGINE_FORMATS), found=name,
                              fix=fix)
    return record

