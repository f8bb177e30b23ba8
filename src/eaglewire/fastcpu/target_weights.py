"""How the lean runtime reads a loaded HF model: each decoder layer's weights as gemm.Linears (q/k/v and
gate/up fused into one GEMM each, HF's own weights then views of the fused ones), the attention head size,
and the model's own rotary embedding module (so every RoPE scaling HF supports is computed by HF).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.fastcpu.gemm import Linear
from eaglewire.errors import TargetError
from eaglewire.target.loader import Target


@dataclass
class Layer:
    """One decoder layer's weights as the runtime reads them."""

    qkv: Linear  # q, k, v side by side: [..., (heads + 2 kv_heads) * head_dim]
    o: Linear
    gate_up: Linear  # gate, up side by side: [..., 2 * intermediate]
    down: Linear
    ln1: torch.Tensor
    ln2: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def read_layer(m: torch.nn.Module, layouts: tuple[str, ...]) -> Layer:
    """A HF decoder layer's weights, each Linear offering `layouts` (the runtime's candidates)."""
    a, f = m.self_attn, m.mlp
    qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
    # share: HF's q/k/v and gate/up weights become views of the fused ones (no second copy in memory)
    return Layer(Linear.fused([a.q_proj, a.k_proj, a.v_proj], layouts, share=True),
                 Linear(a.o_proj.weight, a.o_proj.bias, layouts),
                 Linear.fused([f.gate_proj, f.up_proj], layouts, share=True),
                 Linear(f.down_proj.weight, f.down_proj.bias, layouts),
                 m.input_layernorm.weight.detach(), m.post_attention_layernorm.weight.detach(),
                 None if qn is None else qn.weight.detach(), None if kn is None else kn.weight.detach())


def head_dim(cfg) -> int:
    """A text config's attention head size (configs without `head_dim` split hidden_size evenly)."""
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def find_rotary(target: Target) -> torch.nn.Module:
    """The model's rotary embedding module (its name ends in rotary_emb)."""
    for name, mod in target.model.named_modules():
        if name.endswith("rotary_emb"):
            return mod
    raise TargetError("no rotary embedding module found", expected="a module named *rotary_emb", found="none")
