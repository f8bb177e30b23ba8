"""Runs inside the speculators venv: write a block drafter with speculators' OWN config class and model
(save_pretrained), as its trainer's checkpoints are written, for the doctor to read.

argv: out_dir verifier_dir aux_ids(comma-separated) block_size mask_token_id; writes out_dir/{dflash,dspark,dflash2}"""

import sys

from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.dflash import DFlashSpeculatorConfig
from speculators.models.dflash.core import DFlashDraftModel
from speculators.models.dflash2 import DFlash2SpeculatorConfig
from speculators.models.dflash2.core import DFlash2DraftModel
from speculators.models.dspark import DSparkSpeculatorConfig
from speculators.models.dspark.core import DSparkDraftModel
from speculators.proposals.greedy import GreedyTokenProposalConfig
from transformers import AutoConfig
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config

out, verifier, ids, block, mask = sys.argv[1:6]
target = AutoConfig.from_pretrained(verifier)
layer = Qwen3Config(
    hidden_size=target.hidden_size,
    intermediate_size=2 * target.hidden_size,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=target.hidden_size // 4,
    num_hidden_layers=2,
    vocab_size=target.vocab_size,
)
layer._attn_implementation = "eager"  # flex attention needs a compiler this CPU run does not use
classes = {
    "dflash": (DFlashSpeculatorConfig, DFlashDraftModel),
    "dspark": (DSparkSpeculatorConfig, DSparkDraftModel),
    "dflash2": (DFlash2SpeculatorConfig, DFlash2DraftModel),
}
for kind, (config_cls, model_cls) in classes.items():
    spec = SpeculatorsConfig(
        algorithm=kind,
        default_proposal_method="greedy",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=int(block) - 1)],
        verifier=VerifierConfig(name_or_path=verifier, architectures=target.architectures),
    )
    config = config_cls(
        transformer_layer_config=layer,
        draft_vocab_size=target.vocab_size,
        block_size=int(block),
        aux_hidden_state_layer_ids=[int(i) for i in ids.split(",")],
        mask_token_id=int(mask),
        target_hidden_size=target.hidden_size,
        speculators_config=spec,
    )
    model_cls(config).save_pretrained(f"{out}/{kind}")
print("ok")
