"""Runs inside the speculators venv: load an eaglewire vLLM/speculators export with speculators' own
Eagle3DraftModel, run one draft step on the given inputs, print the max |logit difference| as JSON."""

import json
import sys

import torch
from safetensors.torch import load_file
from speculators.models.eagle3 import Eagle3DraftModel

export_dir, io_file = sys.argv[1], sys.argv[2]
io = load_file(io_file)
model = Eagle3DraftModel.from_pretrained(export_dir, attn_implementation="eager").eval()  # sdpa unsupported there
captured = []
model.lm_head.register_forward_hook(lambda mod, args, out: captured.append(out))
with torch.no_grad():
    model(hidden_states=io["taps"], input_ids=io["ids"], document_ids=torch.zeros_like(io["ids"]), ttt_steps=1)
print(
    json.dumps(
        {
            "max_abs_diff": float((captured[0] - io["logits"]).abs().max()),
            "scale": float(io["logits"].abs().max()),
            "layer_ids": model.config.eagle_aux_hidden_state_layer_ids,
        }
    )
)
