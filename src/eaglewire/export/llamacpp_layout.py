"""llama.cpp's GGUF draft layout as one record of facts, per drafter family (EAGLE-3, DFlash).

Every fact is read from llama.cpp's own source as the PyPI sdist of llama-cpp-python vendors it
(tests/export/test_llamacpp_rules.py reads each one back from that source, per release):

    gguf-py/gguf/constants.py   MODEL_ARCH_NAMES (eagle3, dflash), Keys.LLM.TARGET_LAYERS ... NORM_BEFORE_FC,
                                TENSOR_NAMES (fc, enc.output_norm, blk.{bid}.attn_norm_2, d2t, ...)
    conversion/llama.py         LlamaModel: EAGLE-3 detected by draft_vocab_size + num_hidden_layers == 1;
                                target_layers = the TOP-LEVEL eagle_aux_hidden_state_layer_ids as is, else
                                [2, n//2, n-3] with an INFO line; target_hidden_size; norm_before_residual /
                                norm_before_fc; fc.weight kept, input_norm -> enc.output_norm, *.hidden_norm ->
                                attn_norm_2, d2t written as ABSOLUTE target ids (d2t + arange) in I64, t2d
                                dropped; q/k permuted (undo_permute: llama.cpp ropes EAGLE3 the NORM way)
    conversion/qwen.py          DFlashModel(Qwen3Model): target_layers = dflash_config.target_layer_ids + 1;
                                block_size (default 16), mask_token_id (tokenizer.ggml.mask_token_id),
                                causal, sliding window; q/k not permuted (DFLASH ropes NEOX)
    src/models/eagle3.cpp       exactly 3 target layers; n_layer == 1; reads norm_before_residual and
                                norm_before_fc; feeds the PRE-norm state (t_h_nextn) to the next step
    src/models/dflash.cpp       fc, enc.output_norm (hidden_norm after fc), per-layer q/k norms, optional
                                token_embd / output / d2t
    common/speculative.cpp      EAGLE-3: id < n_layer -> llama_set_embeddings_layer_inp (the INPUT of layer
                                id); id == n_layer -> the target's t_h_nextn; DFlash: layer inputs only;
                                block_size / causal / mask token read from the draft; the draft's vocabulary
                                must match the target's (type, BOS/EOS, token texts)

The PyPI `gguf` package (0.19) has no EAGLE3 / DFLASH arch enums, so the on-disk strings are written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from eaglewire.errors import CheckpointError

STYLE = "gguf"  # the engine record's config_style (export/engines.py)
GGUF_FILE = "draft.gguf"  # what `eaglewire export --format llamacpp` writes (llama-server -md DIR/draft.gguf)
# llama.cpp's GGUF type names the exporter writes (gguf.GGMLQuantizationType members); q8_0 / q4_0 quantize the 2-D
# weights only (llama.cpp keeps norms and 1-D tensors in f32 whatever the file type)
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")

# general keys and per-arch hyperparameters (constants.py Keys.General / Keys.LLM / Keys.Attention / Keys.Rope)
ARCH_KEY = "general.architecture"
FILE_TYPE_KEY = "general.file_type"
HPARAMS = {  # role -> key template; {arch} is the family's arch name
    "context_length": "{arch}.context_length",
    "embedding_length": "{arch}.embedding_length",
    "block_count": "{arch}.block_count",
    "feed_forward_length": "{arch}.feed_forward_length",
    "head_count": "{arch}.attention.head_count",
    "head_count_kv": "{arch}.attention.head_count_kv",
    "key_length": "{arch}.attention.key_length",
    "value_length": "{arch}.attention.value_length",
    "rms_eps": "{arch}.attention.layer_norm_rms_epsilon",
    "rope_freq_base": "{arch}.rope.freq_base",
    "rope_dimension_count": "{arch}.rope.dimension_count",
    "vocab_size": "{arch}.vocab_size",
}
TARGET_LAYERS = "{arch}.target_layers"  # llama-arch.cpp LLM_KV_TARGET_LAYERS
TARGET_HIDDEN_SIZE = "{arch}.target_hidden_size"
NORM_BEFORE_RESIDUAL = "{arch}.norm_before_residual"
NORM_BEFORE_FC = "{arch}.norm_before_fc"
BLOCK_SIZE = "{arch}.block_size"  # LLM_KV_DFLASH_BLOCK_SIZE; speculative.cpp reads "dflash.block_size"
CAUSAL = "{arch}.attention.causal"  # speculative.cpp reads "dflash.attention.causal"
SLIDING_WINDOW = "{arch}.attention.sliding_window"
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"  # llama_vocab_mask(): the DFlash mask token
TOKENIZER_PREFIX = "tokenizer."  # the vocabulary keys; llama-server compares the draft's with the target's

D2T = "d2t"  # int64, ABSOLUTE target ids (the converter adds arange); t2d is not stored


@dataclass(frozen=True)
class GGUFFamily:
    """How llama.cpp stores and serves one drafter family's draft."""

    family: str  # eaglewire's family name (families.py)
    arch: str  # general.architecture (constants.py MODEL_ARCH_NAMES)
    spec_type: str  # llama-server --spec-type
    hf_architectures: tuple[str, ...]  # what the converter registers the family under
    # (native weight name, GGUF name); "{bid}" = a decoder layer index; what is not listed is not stored
    tensors: tuple[tuple[str, str], ...]
    layer_prefix: str  # how native names a decoder layer's weights ("layers.{bid}.")
    permute_qk: bool  # q/k rows reordered for llama.cpp's NORM rope (LlamaModel.permute); False: NEOX rope
    num_taps: int | None  # the only tap count llama.cpp reads (None: any)
    max_layers: int | None  # decoder layers it builds (None: any)
    norms: frozenset[str]  # norm flags (norms.NormFlags) it implements
    dropped: tuple[str, ...]  # native tensors the converter drops (llama.cpp rebuilds what it needs)
    keys: tuple[str, ...]  # family keys the converter writes and llama.cpp reads (templates)
    final_tap: str  # what id == n_layer captures on the target
    converter_ids: str  # how the converter turns the HF config's ids into target_layers
    converter_default: str  # what it writes when the ids are absent
    default_ids: Callable[[int], list[int]] | None = None  # that default for an L-layer target (None: no ids)
    norms_per_release: bool = False  # the norm keys read differ by release (Release.eagle3_norms)
    measured: bool = False  # the doctor measures its wiring from the GGUF's own weights (doctor/gguf_measure.py)
    # a block drafter's block as llama.cpp drafts it: "n_max + 1" = [id_last, MASK x n_max] (speculative.cpp), so a
    # --spec-draft-n-max below block_size - 1 shortens the block the draft attends over (vLLM and eaglewire draft
    # the whole block and verify its first k): serve the whole block (gguf_draft.server_line does)
    block_drafted: str = ""

    @property
    def block(self) -> bool:
        """A block drafter: its block size, mask token, causal flag and window are GGUF keys."""
        return BLOCK_SIZE in self.keys

    def norms_read(self, release: "Release") -> frozenset[str]:
        """The norm flags `release` of llama.cpp reads for this family."""
        return release.eagle3_norms if self.norms_per_release else self.norms

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def gguf_name(self, native: str) -> str | None:
        """The GGUF tensor name of a native weight name; None when llama.cpp drops it."""
        for nat, gg in self.tensors:
            bid = _match(nat, native)
            if bid is not None:
                return gg.format(bid=bid)
        return None

    def native_name(self, gguf_name: str) -> str | None:
        """The native weight name of a GGUF tensor name; None when the family stores no such tensor."""
        for nat, gg in self.tensors:
            bid = _match(gg, gguf_name)
            if bid is not None:
                return nat.format(bid=bid)
        return None


def _match(pattern: str, name: str) -> str | None:
    """ "" when `name` is `pattern` (no {bid}), the layer index when it is `pattern` with {bid} filled, else None."""
    if "{bid}" not in pattern:
        return "" if name == pattern else None
    head, tail = pattern.split("{bid}")
    mid = name[len(head) : len(name) - len(tail)] if name.startswith(head) and name.endswith(tail) else ""
    return mid if mid.isdigit() and str(int(mid)) == mid else None


_LAYER = (  # llama's decoder-layer names: HF -> GGUF (constants.py TENSOR_NAMES, tensor_mapping.py)
    ("layers.{bid}.input_layernorm.weight", "blk.{bid}.attn_norm.weight"),
    ("layers.{bid}.self_attn.q_proj.weight", "blk.{bid}.attn_q.weight"),
    ("layers.{bid}.self_attn.k_proj.weight", "blk.{bid}.attn_k.weight"),
    ("layers.{bid}.self_attn.v_proj.weight", "blk.{bid}.attn_v.weight"),
    ("layers.{bid}.self_attn.o_proj.weight", "blk.{bid}.attn_output.weight"),
    ("layers.{bid}.post_attention_layernorm.weight", "blk.{bid}.ffn_norm.weight"),
    ("layers.{bid}.mlp.gate_proj.weight", "blk.{bid}.ffn_gate.weight"),
    ("layers.{bid}.mlp.up_proj.weight", "blk.{bid}.ffn_up.weight"),
    ("layers.{bid}.mlp.down_proj.weight", "blk.{bid}.ffn_down.weight"),
)
_HEAD = (
    ("norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("embed_tokens.weight", "token_embd.weight"),
    ("fc.weight", "fc.weight"),
    (D2T, D2T),
)

EAGLE3 = GGUFFamily(
    family="eagle3",
    arch="eagle3",
    spec_type="draft-eagle3",
    hf_architectures=("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel"),
    tensors=(
        *_HEAD,
        ("input_norm.weight", "enc.output_norm.weight"),
        ("layers.{bid}.hidden_norm.weight", "blk.{bid}.attn_norm_2.weight"),
        *_LAYER,
    ),
    layer_prefix="layers.{bid}.",
    permute_qk=True,
    num_taps=3,
    max_layers=1,
    norms=frozenset({"norm_before_fc", "norm_before_residual"}),
    dropped=("t2d",),
    keys=(TARGET_LAYERS, TARGET_HIDDEN_SIZE, NORM_BEFORE_RESIDUAL, NORM_BEFORE_FC),
    final_tap="the target's t_h_nextn, set only by model files with a next-token head (gpt-oss, deepseek2, "
    "qwen3.5, ...) and there the pre-norm output; a llama target never sets it",
    converter_ids="the draft config's top-level eagle_aux_hidden_state_layer_ids, as is",
    converter_default="[2, n//2, n-3] (n = the target's num_hidden_layers), with only an INFO log line",
    default_ids=lambda n: [2, n // 2, n - 3],
    norms_per_release=True,
    measured=True,
)

DFLASH = GGUFFamily(
    family="dflash",
    arch="dflash",
    spec_type="draft-dflash",
    hf_architectures=("DFlashDraftModel", "DFlash2DraftModel"),
    tensors=(
        *_HEAD,
        ("hidden_norm.weight", "enc.output_norm.weight"),
        ("layers.{bid}.self_attn.q_norm.weight", "blk.{bid}.attn_q_norm.weight"),
        ("layers.{bid}.self_attn.k_norm.weight", "blk.{bid}.attn_k_norm.weight"),
        *_LAYER,
    ),
    layer_prefix="layers.{bid}.",
    permute_qk=False,
    num_taps=None,
    max_layers=None,
    norms=frozenset(),
    dropped=("t2d",),
    keys=(TARGET_LAYERS, BLOCK_SIZE, CAUSAL, SLIDING_WINDOW),
    final_tap="nothing: DFlash turns on layer inputs only (the graph has no input of layer n_layer)",
    converter_ids="dflash_config.target_layer_ids + 1 (z-lab's 'output of layer k' ids made layer inputs)",
    converter_default="no target_layers key at all (llama.cpp then refuses to load the draft)",
    measured=True,
    block_drafted="n_max + 1",
)

FAMILIES: dict[str, GGUFFamily] = {f.family: f for f in (EAGLE3, DFLASH)}
BY_ARCH: dict[str, GGUFFamily] = {f.arch: f for f in FAMILIES.values()}


@dataclass(frozen=True)
class Release:
    """What one llama.cpp (as a llama-cpp-python version vendors it) serves and converts."""

    version: str  # the llama-cpp-python version whose sdist vendors this llama.cpp (vendor/llama.cpp)
    families: tuple[str, ...]  # src/models/eagle3.cpp, src/models/dflash.cpp present
    eagle3_norms: frozenset[str]  # the norm keys eagle3.cpp reads
    converter_reads_ids: bool  # conversion/llama.py writes the draft config's ids (else always the default)


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release("0.3.36", ("eagle3", "dflash"), EAGLE3.norms, converter_reads_ids=True),
        # 0.3.30: no dflash.cpp; eagle3.cpp reads norm_before_residual only; conversion/llama.py writes
        # [2, n//2, n-3] whatever the draft config says (only a GGUF written with the ids keeps them)
        Release("0.3.30", ("eagle3",), frozenset({"norm_before_residual"}), converter_reads_ids=False),
    )
}
NEWEST = "0.3.36"


def release(version: str | None) -> Release:
    """The record of a llama.cpp release (None: the newest read)."""
    if (version or NEWEST) not in RELEASES:
        raise CheckpointError(
            f"llama.cpp release {version!r} was not read",
            expected=", ".join(RELEASES),
            found=str(version),
            fix="name a llama-cpp-python version whose llama.cpp was read "
            "(tests/export/test_llamacpp_rules.py), or omit --engine-version for the newest",
        )
    return RELEASES[version or NEWEST]
