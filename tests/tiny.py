"""Tiny random HF models built in-process (no downloads), one per architecture family we support."""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from eaglewire.target.loader import Target, wrap_model

VOCAB, HIDDEN, LAYERS = 256, 64, 4
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)


def _configs(layers: int = LAYERS) -> dict[str, PretrainedConfig]:
    _COMMON = {**globals()["_COMMON"], "num_hidden_layers": layers}
    return {
        "llama": LlamaConfig(**_COMMON),
        "qwen2": Qwen2Config(**_COMMON),  # q/k/v biases
        "qwen3": Qwen3Config(**_COMMON, head_dim=16),  # q/k norms
        "mistral": MistralConfig(**_COMMON),
        "qwen3_moe": Qwen3MoeConfig(
            **_COMMON,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
        "deepseek_v3": DeepseekV3Config(
            **{**_COMMON, "num_key_value_heads": 4},
            moe_intermediate_size=32,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    }


ARCHS = tuple(_configs()) + ("nested_kimi_like",)


class KimiLikeConfig(PretrainedConfig):
    """Shape of a multimodal target (Kimi-K2.5): text model nested under `language_model`."""

    model_type = "eaglewire_test_kimi_like"
    sub_configs = {"text_config": DeepseekV3Config}

    def __init__(self, text_config=None, **kw):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**text_config)
        self.text_config = text_config
        super().__init__(**kw)


class KimiLikeForConditionalGeneration(PreTrainedModel):
    config_class = KimiLikeConfig

    def __init__(self, config: KimiLikeConfig):
        super().__init__(config)
        # A vision tower with as many blocks as the text model has layers: the locator must not pick it.
        self.vision_tower = nn.ModuleList(nn.Linear(8, 8) for _ in range(config.text_config.num_hidden_layers))
        self.mm_projector = nn.Linear(8, config.text_config.hidden_size)
        self.language_model = AutoModelForCausalLM.from_config(config.text_config)

    def forward(self, input_ids=None, **kwargs):
        return self.language_model(input_ids=input_ids, **kwargs)


def build_model(arch: str, seed: int = 0, layers: int = LAYERS) -> nn.Module:
    torch.manual_seed(seed)
    if arch == "nested_kimi_like":
        cfg = KimiLikeConfig(
            text_config=_configs(layers)["deepseek_v3"], architectures=["KimiLikeForConditionalGeneration"]
        )
        model = KimiLikeForConditionalGeneration(cfg)
    else:
        model = AutoModelForCausalLM.from_config(_configs(layers)[arch])
    return model.float().eval()


def build_target(arch: str = "llama", seed: int = 0, layers: int = LAYERS) -> Target:
    return wrap_model(build_model(arch, seed, layers), name=f"tiny-{arch}")


def build_draft(target: Target, taps=(1, 2, 3), draft_vocab: int = 128, seed: int = 0, **draft_kw):
    """A random-init draft for `target` with a reduced vocab (every other target id), embedding attached."""
    from eaglewire.norms import NormFlags
    from eaglewire.draft.config import DraftConfig
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.draft.vocab import VocabMap

    norm = draft_kw.pop("norm", NormFlags())
    vmap = VocabMap.from_target_ids(torch.arange(0, 2 * draft_vocab, 2), target.vocab_size)
    contract = target.contract(tuple(taps), norm=norm, vocab_map=vmap)
    cfg = DraftConfig.from_target(target.text_config, contract, **draft_kw)
    draft = Eagle3Draft(cfg).init_random(seed)
    draft.d2t.copy_(vmap.d2t)
    draft.t2d.copy_(vmap.t2d)
    draft.attach_embedding(target.embed_tokens.weight)
    return draft, contract


def build_dflash(
    target: Target,
    taps=(1, 2, 3),
    block_size: int = 4,
    layers: int = 2,
    seed: int = 0,
    mask_token_id: int | None = None,
    vocab_every: int | None = None,
    **block_kw,
):
    """A random-init DFlash draft for `target` (mask token default the last id), target attached: over the full
    vocabulary, or (vocab_every k) a reduced one of every k-th id with its own head."""
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.draft.vocab import VocabMap
    from eaglewire.families import BlockWiring

    V = target.vocab_size
    vmap = VocabMap.from_target_ids(torch.arange(0, V, vocab_every), V) if vocab_every else None
    block = BlockWiring(block_size, V - 1 if mask_token_id is None else mask_token_id, **block_kw)
    contract = dflash_contract(target, tuple(taps), block, vmap)
    return build_dflash_draft(target, contract, layers, seed=seed, vmap=vmap), contract


def tiny_samples(n: int = 24, seed: int = 0, min_len: int = 12, max_len: int = 24):
    """Token sequences with a repeating structure (learnable) and a loss mask on their second half."""
    from eaglewire.data.samples import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        start = int(torch.randint(0, VOCAB - 40, (1,), generator=g))
        ids = (start + torch.arange(T) * 3) % VOCAB  # an arithmetic pattern the draft can learn
        mask = torch.zeros(T, dtype=torch.long)
        mask[T // 2 :] = 1
        out.append(Sample(id=f"s{i}", input_ids=ids, loss_mask=mask))
    return out


def assert_matches_hf(target: Target, rt) -> None:
    """A runtime's prefill (with taps) and single-token decode steps equal HF transformers' forward within
    1e-4 (fp32): logits [1, T, V] and the tapped boundaries [1, T, 3H]."""
    from eaglewire.capture.hooks import capture

    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits  # [1, 12, V]
    pos = torch.arange(12)[None]
    logits, taps = rt.forward(ids[:, :9], pos[:, :9], 0, taps=(0, 2, 4))
    torch.testing.assert_close(logits, ref[:, :9], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(taps, capture(target, (0, 2, 4), ids[:, :9]).taps, atol=1e-4, rtol=1e-4)
    for t in range(9, 12):  # single-token decode steps on the cache
        step, _ = rt.forward(ids[:, t : t + 1], pos[:, t : t + 1], t)
        torch.testing.assert_close(step[:, 0], ref[:, t], atol=1e-4, rtol=1e-4)
