"""A lean forward for Llama-family targets with a static KV cache and arbitrary (tree) attention masks.

Supported: Llama (SmolLM2), Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm per head). It reads the
weights of the loaded HF model (no copy of HF's modeling code) and reuses the model's own rotary
embedding module, so every RoPE scaling type HF supports is computed by HF.

Why it exists: for small row counts MKL's GEMM speed depends on weight orientation, and the fastest one
differs by row count and machine (research notes found `(W @ x.T).T` best for 2..16 rows; a later
measurement here found `x @ W.t()` best there and `x @ Wt` best for 1 row). The runtime keeps both
orientations, `calibrate()` measures each per row count, and every call uses the winner.

KV cache: [L, B, kv_heads, max_len, head_dim], allocated once. `forward(..., start=s)` writes the T new
keys/values into slots s..s+T-1 and attends to slots [0, s+T) under `mask`; positions (RoPE) are given
per token, so tree nodes at the same depth share a position. `commit(src, dst)` moves accepted tree
slots into place with one gather + copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eaglewire.errors import TargetError
from eaglewire.verifier.loader import Target

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


LAYOUTS = ("nt", "tn", "wx")


class Linear:
    """A weight [out, in] (+ bias) kept in both orientations, so each call can use the faster GEMM:
    "nt" x @ W.t() (nn.Linear's), "tn" x @ Wt with Wt contiguous, "wx" (W @ x.T).T."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.w = weight.detach().contiguous()  # [out, in]
        self.wt = self.w.t().contiguous()  # [in, out]
        self.b = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor, layout: str) -> torch.Tensor:  # x [..., in] -> [..., out]
        if layout == "tn":
            y = x @ self.wt
        elif layout == "nt":
            y = x @ self.w.t()
        else:  # "wx": weight as the tall left operand
            y = (self.w @ x.reshape(-1, x.shape[-1]).t()).t().reshape(*x.shape[:-1], -1)
        return y if self.b is None else y + self.b


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm, same op order (fp32 statistics, weight applied in the input dtype)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos/sin [B, 1, T, D] (HF rotate-half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@dataclass
class _Layer:
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    ln1: torch.Tensor
    ln2: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


class LeanTarget:
    def __init__(self, target: Target, max_len: int, batch: int = 1, layout: str = "auto") -> None:
        """layout: one of LAYOUTS for every call, or "auto": tn for one row, nt otherwise, until
        `calibrate()` measures the fastest per row count on this machine."""
        cfg = target.text_config
        if cfg.model_type not in SUPPORTED:
            raise TargetError(f"the lean runtime does not support model_type {cfg.model_type!r}",
                              expected=" / ".join(SUPPORTED), found=cfg.model_type,
                              fix="use the HF fallback runtime (same results, slower)")
        self.target, self.cfg, self.max_len = target, cfg, max_len
        self.eps = float(cfg.rms_norm_eps)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.layers = [self._layer(m) for m in target.layers]
        self.norm = target.final_norm.weight.detach()
        self.embed = target.embed_tokens.weight.detach()
        self.head = Linear(target.model.get_output_embeddings().weight, None)
        self.policy: dict[int, str] = {1: "tn", 2: "nt"} if layout == "auto" else {1: layout}
        self.rotary = _find_rotary(target)
        p = self.embed
        shape = (len(self.layers), batch, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def layout(self, rows: int) -> str:
        """The layout measured (or assumed) fastest for the largest calibrated row count <= rows."""
        return self.policy[max(k for k in self.policy if k <= rows)]

    @torch.no_grad()
    def calibrate(self, ks: tuple[int, ...] = (1, 2, 3, 4, 8, 16, 32), reps: int = 5) -> dict[int, str]:
        """Time a whole verify forward per layout and row count on this machine; keep the fastest.
        MKL's small-M GEMM speed depends on orientation, and which one wins differs between machines.
        Layouts alternate within each repetition (machine noise drifts; back-to-back blocks biased it)."""
        import time

        best: dict[int, str] = {}
        prefix = 16
        for k in ks:
            ids = torch.zeros(1, prefix + k, dtype=torch.long, device=self.embed.device)
            pos = torch.arange(prefix + k, device=ids.device)[None]
            samples: dict[str, list[float]] = {lay: [] for lay in LAYOUTS}
            for _ in range(reps):
                for lay in LAYOUTS:
                    self.policy = {1: lay}
                    t0 = time.perf_counter()
                    self.forward(ids[:, prefix:], pos[:, prefix:], prefix)
                    samples[lay].append(time.perf_counter() - t0)
            timing = {lay: sorted(v)[len(v) // 2] for lay, v in samples.items()}
            best[k] = min(timing, key=timing.get)
        self.policy = best
        return best

    def _layer(self, m: torch.nn.Module) -> _Layer:
        a, f = m.self_attn, m.mlp
        lin = lambda mod: Linear(mod.weight, mod.bias)  # noqa: E731
        qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        return _Layer(lin(a.q_proj), lin(a.k_proj), lin(a.v_proj), lin(a.o_proj), lin(f.gate_proj), lin(f.up_proj),
                      lin(f.down_proj), m.input_layernorm.weight.detach(), m.post_attention_layernorm.weight.detach(),
                      None if qn is None else qn.weight.detach(), None if kn is None else kn.weight.detach())

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
                taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [B, T]; mask bool [B, 1, T, start+T] (None = causal over the cache);
        returns (logits [B, T, V] or [B, R, V] for logit_rows [R], taps [B, T, n*H] or None)."""
        B, T = ids.shape
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start}+{T} > max_len {self.max_len}")
        if mask is None:
            mask = torch.ones(T, start + T, dtype=torch.bool, device=ids.device).tril(start)[None, None]
        cos, sin = self.rotary(self.embed[:1][None], positions)  # [B, T, D] each, computed by HF
        cos, sin = cos[:, None], sin[:, None]
        h = self.embed[ids]  # [B, T, H]
        lay = self.layout(B * T)
        collected = [h] if 0 in taps else []
        for i, L in enumerate(self.layers):
            h = h + self._attention(L, i, rms_norm(h, L.ln1, self.eps), cos, sin, start, mask, lay)
            x = rms_norm(h, L.ln2, self.eps)
            h = h + L.down(F.silu(L.gate(x, lay)) * L.up(x, lay), lay)
            if i + 1 in taps:
                collected.append(h)
        h = rms_norm(h if logit_rows is None else h[:, logit_rows], self.norm, self.eps)
        return self.head(h, self.layout(h.shape[0] * h.shape[1])), (torch.cat(collected, dim=-1) if taps else None)

    def _attention(self, L: _Layer, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                   mask: torch.Tensor, lay: str) -> torch.Tensor:
        B, T, _ = x.shape
        hd = self.head_dim
        q = L.q(x, lay).view(B, T, self.heads, hd)
        k = L.k(x, lay).view(B, T, self.kv_heads, hd)
        if L.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q, k = rms_norm(q, L.q_norm, self.eps), rms_norm(k, L.k_norm, self.eps)
        q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        v = L.v(x, lay).view(B, T, self.kv_heads, hd).transpose(1, 2)
        self.k_cache[i, :B, :, start:start + T] = k
        self.v_cache[i, :B, :, start:start + T] = v
        keys, values = self.k_cache[i, :B, :, :start + T], self.v_cache[i, :B, :, :start + T]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return L.o(out.transpose(1, 2).reshape(B, T, -1), lay)

    def commit(self, src: torch.Tensor, dst_start: int) -> None:
        """Move cache slots `src` [n] (accepted tree nodes, in path order) to dst_start..dst_start+n-1."""
        n = src.numel()
        dst = slice(dst_start, dst_start + n)
        self.k_cache[:, :, :, dst] = self.k_cache[:, :, :, src]  # advanced indexing gathers a copy first
        self.v_cache[:, :, :, dst] = self.v_cache[:, :, :, src]


def _find_rotary(target: Target):
    for name, mod in target.model.named_modules():
        if name.endswith("rotary_emb"):
            return mod
    raise TargetError("no rotary embedding module found", expected="a module named *rotary_emb", found="none")
