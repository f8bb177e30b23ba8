"""Runs inside the speculators venv: load an eaglewire vLLM/speculators DFlash export with speculators' own
DFlashSpeculatorConfig and DFlashDraftModel (its verifier's embedding and head filled from the target), and
print as JSON the fields it read and the largest difference between its weights and the export's."""

import json
import sys

from safetensors.torch import load_file
from speculators.models.dflash import DFlashSpeculatorConfig
from speculators.models.dflash.core import DFlashDraftModel

export_dir = sys.argv[1]
cfg = DFlashSpeculatorConfig.from_pretrained(export_dir)
model = DFlashDraftModel.from_pretrained(export_dir, attn_implementation="eager").eval()
ours, theirs = load_file(f"{export_dir}/model.safetensors"), model.state_dict()
layer = cfg.transformer_layer_config
print(
    json.dumps(
        {
            "aux_hidden_state_layer_ids": cfg.aux_hidden_state_layer_ids,
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "sliding_window_non_causal": cfg.sliding_window_non_causal,
            "sample_from_anchor": cfg.sample_from_anchor,
            "rope_theta": layer.rope_parameters["rope_theta"],
            "num_layers": layer.num_hidden_layers,
            "use_draft_vocab": bool(model.use_draft_vocab),
            "missing": sorted(set(ours) - set(theirs)),
            "max_abs_diff": max(
                float((theirs[k].float() - v.float()).abs().max()) for k, v in ours.items() if k in theirs
            ),
        }
    )
)
