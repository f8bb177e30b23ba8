"""Runs inside the vLLM venv: resolve DFlash draft configs the way vLLM 0.32 does before it builds the draft
(speculators configs through SpeculatorsConfig and its update_dflash; z-lab/HF configs wrapped in EAGLEConfig
as SpeculativeConfig does), then ask vLLM's own functions what they read: the aux layer ids it captures
(get_eagle3_aux_layers_from_config), each layer's causality (qwen3_dflash._dflash_layer_causal), the RoPE base
and style, the mask token. Prints one JSON object per directory given."""

import json
import sys
from types import SimpleNamespace

from transformers import AutoConfig
from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal
from vllm.transformers_utils.configs.eagle import EAGLEConfig
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

out = {}
for d in sys.argv[1:]:
    raw = json.load(open(f"{d}/config.json"))
    if "speculators_model_type" in raw:
        hf = SpeculatorsConfig.from_pretrained(d)
    else:
        hf = EAGLEConfig(AutoConfig.from_pretrained(d), method="dflash", model_type="eagle")
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))
    out[d] = {
        "aux": list(get_eagle3_aux_layers_from_config(spec) or []),
        "causal": [_dflash_layer_causal(hf, i) for i in range(hf.num_hidden_layers)],
        "rope_theta": hf.rope_parameters["rope_theta"],
        "neox": getattr(hf, "is_neox_style", True),
        "mask_token_id": (getattr(hf, "dflash_config", None) or {}).get("mask_token_id"),
        "architectures": list(hf.architectures),
        "draft_vocab_size": getattr(hf, "draft_vocab_size", None),
    }
print(json.dumps(out))
