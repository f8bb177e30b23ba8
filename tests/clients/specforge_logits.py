"""Runs inside the SpecForge venv: load an eaglewire SpecForge (or SGLang) export the way SpecForge's trainer
warm-starts an EAGLE-3 draft, run one draft step on the given inputs, print one JSON line.

Nothing is stubbed or re-implemented; every step is SpecForge 0.2.0's own code:
  run config   specforge.config.Config (offline eagle3 run: draft_checkpoint_path = the export,
               target_model_path = the tiny target, torch_dtype float32, the attention backend below)
  draft config training.model_loading.resolve_draft_config (reads the export's config.json)
  layer ids    algorithms.model_providers.resolve_eagle_capture_layers (the ids SpecForge captures)
  model        algorithms.model_providers.build_eagle3_draft: AutoDraftModel.from_config, then
               warm_start_draft_model (weights from the export, strict but for the embedding), then
               load_embedding(target) (model.embed_tokens.weight from the target's model.safetensors)
  forward      on CPU, three ways (fa and usp need flash_attn, i.e. CUDA):
               - "train" (attention_backend "sdpa"): the calls Eagle3Model.forward (algorithms/eagle3/model.py)
                 makes for TTT step 0: project_hidden_states -> prepare_decoder_attention_mask ->
                 embed_input_ids -> backbone (cache_hidden=[[], []]) -> compute_logits
               - "train_flex" (attention_backend "flex_attention", SpecForge's training default): the same
                 with its flex path (raw [B, T] mask, DynamicCache); flex_attention runs uncompiled on CPU
                 (torch warns it is slow, which is fine at this size)
               - "forward" (sdpa): LlamaForCausalLMEagle3.forward(hidden_states, inputs_embeds), which
                 returns norm(h), -> lm_head
SpecForge's @torch.compile'd helpers (RMSNorm, RoPE) run compiled, as in SpecForge.
(AutoDraftModel.from_pretrained alone is NOT used: under transformers 5.8.1 it leaves the non-persistent
RoPE caches uninitialised; SpecForge's warm start only takes its state_dict, as done here.)
"""

import json
import sys

import torch
from safetensors.torch import load_file
from specforge.algorithms.eagle3.providers import algorithm_providers
from specforge.algorithms.model_providers import build_eagle3_draft, resolve_eagle_capture_layers
from specforge.config import Config
from specforge.modeling.target.target_utils import load_target_config
from specforge.training.model_loading import resolve_draft_config
from transformers.cache_utils import DynamicCache

export_dir, target_dir, io_file = sys.argv[1], sys.argv[2], sys.argv[3]
io = load_file(io_file)
ids, taps, ours = io["ids"], io["taps"], io["logits"]


def build(attention_backend: str):
    """SpecForge's own config resolution and draft builder for an offline eagle3 run on this export."""
    cfg = Config(
        model={"target_model_path": target_dir, "draft_checkpoint_path": export_dir, "torch_dtype": "float32"},
        data={"hidden_states_path": io_file},
        training={"attention_backend": attention_backend, "strategy": "eagle3"},
    )
    draft_config = resolve_draft_config(cfg, provider=algorithm_providers().model.draft_config)
    return cfg, draft_config, build_eagle3_draft(cfg, draft_config).eval()


cfg, draft_config, model = build("sdpa")
layer_ids = resolve_eagle_capture_layers(
    cfg, draft_config, load_target_config(target_dir, cache_dir=None, trust_remote_code=False)
)
b, t, _ = taps.shape
positions = torch.arange(t).unsqueeze(0)
with torch.no_grad():
    hidden = model.project_hidden_states(taps)
    mask = model.prepare_decoder_attention_mask(
        attention_mask=torch.ones(b, t, dtype=torch.bool),
        hidden_states=hidden,
        batch_size=b,
        seq_length=t,
        past_key_values_length=0,
    )
    embeds = model.embed_input_ids(ids).to(hidden.dtype)
    out = model.backbone(
        input_embeds=embeds,
        hidden_states=hidden,
        cache_hidden=[[], []],
        attention_mask=mask,
        position_ids=positions,
        past_key_values=None,
        use_cache=True,
    )
    train_logits = model.compute_logits(out)
    fwd_logits = model.lm_head(model(hidden_states=taps, inputs_embeds=model.embed_input_ids(ids)))

    _, _, flex = build("flex_attention")
    out = flex.backbone(
        input_embeds=flex.embed_input_ids(ids),
        hidden_states=flex.project_hidden_states(taps),
        cache_hidden=None,
        attention_mask=torch.ones(b, t, dtype=torch.bool),
        position_ids=positions,
        past_key_values=DynamicCache(),
        use_cache=True,
    )
    flex_logits = flex.compute_logits(out)

exported = load_file(f"{export_dir}/model.safetensors")
print(
    json.dumps(
        {
            "train_max_abs_diff": float((train_logits - ours).abs().max()),
            "train_flex_max_abs_diff": float((flex_logits - ours).abs().max()),
            "forward_max_abs_diff": float((fwd_logits - ours).abs().max()),
            "scale": float(ours.abs().max()),
            "layer_ids": layer_ids,
            "norm_output_read": bool(model.norm_output),
            "fc_norm_built": model.fc_norm is not None,
            "d2t_equal": bool(torch.equal(model.d2t, exported["d2t"])),
            "t2d_equal": bool(torch.equal(model.t2d, exported["t2d"])),
        }
    )
)
