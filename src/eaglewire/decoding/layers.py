"""How a runtime reads a loaded HF model: each decoder layer's weights (q/k/v and gate/up fused into one
GEMM each, HF's own weights then views of the fused ones), the attention head size, and the model's own
rotary embedding module (so every RoPE scaling HF supports is computed by HF).

`Dense` is the plain GEMM (nn.Linear's `F.linear`); the CPU acceleration layer (eaglewire.fastcpu) builds
the same layers from its own subclass, which offers several weight layouts per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from eaglewire.errors import TargetError
from eaglewire.target.loader import Target


class Dense:
    """A weight [out, in] (+ bias [out]) applied as nn.Linear applies it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.w = weight.detach().contiguous()  # [out, in]
        self.b = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return F.linear(x, self.w, self.b)

    @classmethod
    def fused(cls, mods: list[torch.nn.Module], *args: Any, share: bool = False) -> Any:
        """One weight computing every module's output side by side ([..., sum of outs]): one GEMM, not n.
        A module without bias gets zeros in the fused bias (its output is then exactly unchanged).
        share: the modules' weights and biases become views of the fused ones (the same values, so their
        own forward is unchanged), so that the fused weight is not a second copy in memory (in a Llama
        layer q/k/v and gate/up hold two thirds of the weights). `args` go to the subclass's constructor."""
        weight = torch.cat([m.weight.detach() for m in mods])  # [sum out, in]
        bias = None
        if any(m.bias is not None for m in mods):
            bias = torch.cat(
                [m.bias.detach() if m.bias is not None else weight.new_zeros(m.weight.shape[0]) for m in mods]
            )
        if share:
            _share(mods, weight, bias)
        return cls(weight, bias, *args)


def _share(mods: list[torch.nn.Module], weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Point each module's weight (and bias) at its rows of the fused `weight` [sum out, in] (`bias`)."""
    row = 0
    for m in mods:
        n = int(m.weight.shape[0])
        m.weight.data = weight[row : row + n]  # contiguous rows: a view, not a copy
        if m.bias is not None:
            m.bias.data = bias[row : row + n]
        row += n


@dataclass
class Layer:
    """One decoder layer's weights as the runtime reads them (each GEMM a Dense or a subclass of it)."""

    qkv: Any  # q, k, v side by side: [..., (heads + 2 kv_heads) * head_dim]
    o: Any
    gate_up: Any  # gate, up side by side: [..., 2 * intermediate]
    down: Any
    ln1: torch.Tensor
    ln2: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def read_layer(m: torch.nn.Module, fuse: Callable[[list[torch.nn.Module]], Any]) -> Layer:
    """A HF decoder layer's weights; `fuse(modules)` makes one GEMM of the modules' weights (Dense.fused
    with share=True, or a subclass's)."""
    a, f = m.self_attn, m.mlp
    qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
    return Layer(
        fuse([a.q_proj, a.k_proj, a.v_proj]),
        fuse([a.o_proj]),
        fuse([f.gate_proj, f.up_proj]),
        fuse([f.down_proj]),
        m.input_layernorm.weight.detach(),
        m.post_attention_layernorm.weight.detach(),
        None if qn is None else qn.weight.detach(),
        None if kn is None else kn.weight.detach(),
    )


def head_dim(cfg: Any) -> int:
    """A text config's attention head size (configs without `head_dim` split hidden_size evenly)."""
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def find_rotary(target: Target) -> torch.nn.Module:
    """The model's rotary embedding module (its name ends in rotary_emb)."""
    for name, mod in target.model.named_modules():
        if name.endswith("rotary_emb"):
            return mod
    raise TargetError("no rotary embedding module found", expected="a module named *rotary_emb", found="none")
