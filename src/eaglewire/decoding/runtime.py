"""The target's verify forward: Llama-family targets with a static KV cache and arbitrary (tree) masks.

Supported: Llama (SmolLM2), Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm per head). It reads the
weights of the loaded HF model (no copy of HF's modeling code: decoding/layers.py) and reuses the model's
own rotary embedding module, so every RoPE scaling type HF supports is computed by HF. Any other target
runs through transformers' own forward (hf_runtime.HFRuntime): the same tokens, slower.

`Runtime` is what the speculative decoder needs of a target; `StaticRuntime` is its plain implementation
(torch's GEMMs), and the CPU acceleration layer (eaglewire.fastcpu) subclasses it with calibrated weight
layouts and compiled graphs, overriding only how GEMMs, the layer stack and the head run.

`forward` returns logits (sampling needs them all); `greedy` returns each row's argmax.

KV cache: [L, B, kv_heads, cache_slots, head_dim] (a spare slot or more), allocated once.
`forward(..., start=s)` writes the T new keys/values into slots s..s+T-1 and attends to slots [0, s+T)
under `mask`; positions (RoPE) are given per token, so tree nodes at the same depth share a position.
`commit(src, dst)` moves accepted tree slots into place with one gather + copy.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F

from eaglewire.contract import CANONICAL, HOOKED, renumber
from eaglewire.decoding.hf_runtime import HFRuntime
from eaglewire.decoding.layers import Dense, Layer, find_rotary, head_dim, read_layer
from eaglewire.errors import TargetError
from eaglewire.ops import rms_norm, rotate, sdpa, signed_sin
from eaglewire.target.loader import Target

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]  # ops.sdpa's signature
Out = tuple[torch.Tensor, torch.Tensor | None]  # (logits, argmax tokens or states; taps [B, T, n*H] or None)


class Runtime(Protocol):
    """What SpecDecoder needs of a target: a verify forward over a static cache, and moving accepted slots."""

    target: Target
    max_len: int

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> Out: ...

    def greedy(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> Out: ...

    def commit(self, src: torch.Tensor, dst_start: int) -> None: ...


def additive_mask(
    mask: torch.Tensor | None, T: int, start: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """The attention mask every layer uses, built once per forward: None for one causal row (it sees all
    start+1 cached slots, exactly what SDPA does unmasked); else 0 / -inf in `dtype` [.., T, start+T],
    which SDPA would otherwise rebuild from a bool mask in each of the L layers."""
    if mask is None:
        if T == 1:
            return None
        mask = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(start)[None, None]
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))


def _plain(lin: Dense, x: torch.Tensor) -> torch.Tensor:
    return lin(x)


class StaticRuntime:
    """The plain runtime: torch's GEMMs (nn.Linear's), eager attention through SDPA."""

    def __init__(self, target: Target, max_len: int, batch: int = 1) -> None:
        cfg = target.text_config
        if cfg.model_type not in SUPPORTED:
            raise TargetError(
                f"the static-cache runtime does not support model_type {cfg.model_type!r}",
                expected=" / ".join(SUPPORTED),
                found=cfg.model_type,
                fix="use the HF fallback runtime (decoding.runtime.plain_runtime picks it)",
            )
        self.target, self.cfg, self.max_len = target, cfg, max_len
        self.eps = float(cfg.rms_norm_eps)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = head_dim(cfg)
        self.layers: list[Layer] = [read_layer(m, self._fuse) for m in target.layers]
        self.norm = target.final_norm.weight.detach()
        self.embed = target.embed_tokens.weight.detach()
        self.head = self._dense(target.model.get_output_embeddings().weight, None)
        self.rotary = find_rotary(target)
        p = self.embed
        shape = (len(self.layers), batch, self.kv_heads, self.cache_slots(max_len), self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        # per-layer views, taken once: a step indexes each layer's cache four times, and every index op costs
        # dispatch time on a CPU (30 layers: ~250 ops a step saved against k_cache[i, :B, ...])
        self.k_layers, self.v_layers = list(self.k_cache.unbind(0)), list(self.v_cache.unbind(0))

    # --- what a subclass replaces: how weights are held, how the layer stack and the head run ---------------
    def _fuse(self, mods: list[torch.nn.Module]) -> Dense:
        return Dense.fused(mods, share=True)

    def _dense(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Dense:
        return Dense(weight, bias)

    def cache_slots(self, max_len: int) -> int:
        """KV cache slots: one spare, never written, so no forward's view of the cache spans all of it."""
        return max_len + 1

    def _layers(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
    ) -> Out:
        return self.layers_forward(h, cos, sin, start, mask, taps, _plain, sdpa)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:  # [B, R, H] -> [B, R, V]
        return self.head(h)

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """Final-norm states [B, R, H] -> the head's argmax [B, R]."""
        return self._logits(h).argmax(-1)

    # --- the forward ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> Out:
        """ids, positions [B, T]; mask bool [B, 1, T, start+T] (None = causal over the cache);
        returns (logits [B, T, V] or [B, R, V] for logit_rows [R], taps [B, T, n*H] or None)."""
        h, tapped = self.hidden(ids, positions, start, mask, taps, logit_rows)
        return self._logits(h), tapped

    @torch.no_grad()
    def greedy(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> Out:
        """forward's arguments; returns (the argmax token of each row [B, T] or [B, R], taps): what greedy
        decoding needs."""
        h, tapped = self.hidden(ids, positions, start, mask, taps, logit_rows)
        return self.argmax(h), tapped

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> Out:
        """forward without the head: (final-norm states [B, T or R, H], taps [B, T, n*H] or None)."""
        B, T = ids.shape
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start}+{T} > max_len {self.max_len}")
        mask = additive_mask(mask, T, start, self.embed.dtype, ids.device)
        cos, sin = self.rotary(self.embed[:1][None], positions)  # [B, T, D] each, computed by HF
        cos, sin = cos[:, None], signed_sin(sin[:, None])
        h, tapped = self._layers(self.embed[ids], cos, sin, start, mask, taps)  # embeddings [B, T, H] in
        h = rms_norm(h if logit_rows is None else h[:, logit_rows], self.norm, self.eps)
        return h, tapped

    def layers_forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
        linear: Callable[[Any, torch.Tensor], torch.Tensor],
        attend: Attend,
    ) -> Out:
        """The decoder layers on embeddings h [B, T, H] (cos, sin [B, 1, T, D]; mask additive or None):
        (the last layer's output [B, T, H], before the final norm; taps [B, T, n*H] or None). `linear(lin,
        x)` runs each GEMM and `attend` the attention, so that an accelerated subclass can trace this very
        code with its own GEMMs and attention (one definition of the layer)."""
        collected = [h] if 0 in taps else []
        tapped_after = set(renumber([b for b in taps if b], CANONICAL, HOOKED, len(self.layers)))  # layers read
        for i, L in enumerate(self.layers):
            h = h + self._attention(L, i, rms_norm(h, L.ln1, self.eps), cos, sin, start, mask, linear, attend)
            x = rms_norm(h, L.ln2, self.eps)
            gate, up = linear(L.gate_up, x).chunk(2, dim=-1)  # [B, T, I] views of one [B, T, 2I] GEMM output
            h = h + linear(L.down, F.silu(gate) * up)
            if i in tapped_after:
                collected.append(h)
        return h, (torch.cat(collected, dim=-1) if taps else None)

    def _attention(
        self,
        L: Layer,
        i: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        linear: Callable[[Any, torch.Tensor], torch.Tensor],
        attend: Attend,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        hd = self.head_dim
        qkv = linear(L.qkv, x)  # [B, T, (heads + 2 kv_heads) * D]
        nq = self.heads + self.kv_heads
        if L.q_norm is None:  # q and k are adjacent columns: one RoPE over both, split after
            qk = rotate(qkv[..., : nq * hd].view(B, T, nq, hd).transpose(1, 2), cos, sin)  # [B, nq, T, D]
            q, k = qk[:, : self.heads], qk[:, self.heads :]
        else:  # Qwen3: RMSNorm over each head (its own weight for q and for k) before RoPE
            q = rms_norm(qkv[..., : self.heads * hd].view(B, T, self.heads, hd), L.q_norm, self.eps)
            k = rms_norm(
                qkv[..., self.heads * hd : nq * hd].view(B, T, self.kv_heads, hd),
                L.k_norm,  # type: ignore[arg-type]
                self.eps,
            )  # k_norm is set wherever q_norm is (read_layer)
            q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        v = qkv[..., nq * hd :].view(B, T, self.kv_heads, hd).transpose(1, 2)
        kc, vc = self.k_layers[i], self.v_layers[i]  # [batch, kv_heads, slots, D]
        if B != kc.shape[0]:
            kc, vc = kc[:B], vc[:B]
        kc.narrow(2, start, T).copy_(k)
        vc.narrow(2, start, T).copy_(v)
        keys, values = kc.narrow(2, 0, start + T), vc.narrow(2, 0, start + T)
        out = attend(q, keys, values, mask)  # [B, heads, T, D]
        return linear(L.o, out.transpose(1, 2).reshape(B, T, -1))

    def commit(self, src: torch.Tensor, dst_start: int) -> None:
        """Move cache slots `src` [n] (accepted tree nodes, in path order) to dst_start..dst_start+n-1."""
        n = src.numel()
        dst = slice(dst_start, dst_start + n)
        self.k_cache[:, :, :, dst] = self.k_cache[:, :, :, src]  # advanced indexing gathers a copy first
        self.v_cache[:, :, :, dst] = self.v_cache[:, :, :, src]


def plain_runtime(target: Target, max_len: int) -> Runtime:
    """The runtime that needs nothing beyond torch: StaticRuntime where the architecture is supported, else
    transformers' own forward (the same tokens, slower). Acceptance does not depend on which runs."""
    spread = len({str(d) for d in (getattr(target.model, "hf_device_map", None) or {}).values()}) > 1
    if target.text_config.model_type in SUPPORTED and not spread:
        return StaticRuntime(target, max_len)
    return HFRuntime(target, max_len)  # transformers' forward moves activations between a spread target's GPUs
