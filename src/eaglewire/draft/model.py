"""The EAGLE-3 draft model, written from the paper and the engines' behaviour (no copied model files).

    taps [B,T,n*H_t] --(input_norm | fc_norm per chunk)--> fc --> h [B,T,H]
    layer 0:   x = [ input_layernorm(embed(ids)) ; hidden_norm(h) ]   (width 2H)  -> attn -> MLP
    layers>0:  plain pre-norm decoder layers (width H)
    logits = lm_head(norm(h_out))  over the draft vocab;  next step is fed h_out (pre-norm), or
             norm(h_out) with `norm_output` (EAGLE-3.1)

`fuse` is the only entry for target taps and refuses any width other than n*H_t, so the silent
`if h.shape[-1] != emb.shape[-1]: h = fc(h)` skip of EAGLE/SGLang cannot happen here; `step` is the
only entry for the draft's own H-wide state and refuses anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.errors import CheckpointError, TapWidthError
from eaglewire.ops import rms_norm, rope_tables, rotate

KV = tuple[torch.Tensor, torch.Tensor]  # ([B, kv_heads, S, head_dim], same)


@dataclass
class SlotWrite:
    """One layer's view of a preallocated cache: write the new keys at slots start.., attend [0, start+T)."""

    k: torch.Tensor  # [B, kv_heads, max_len, head_dim]
    v: torch.Tensor
    start: int
    rope: torch.Tensor  # [max_len, 2 * head_dim]: cos | signed sin per position (see rope_rows)


class DraftCache:
    """The draft's KV cache for decoding, allocated once ([layers, B, kv_heads, max_len, head_dim]), and the
    RoPE rows of every position it can hold (a decoding position never exceeds its slot)."""

    def __init__(
        self,
        cfg: "DraftConfig",
        batch: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (cfg.num_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        # Why a table: rope_tables is ~15 small ops per call, each several microseconds on a CPU, and a
        # chain round calls it three times; a lookup is one. Same values: the same elementwise formula.
        cos, ssin = rope_tables(torch.arange(max_len, device=device)[None], cfg.head_dim, cfg.rope_theta, dtype)
        self.rope = torch.cat([cos[0, 0], ssin[0, 0]], dim=-1)  # [max_len, 2 * head_dim]

    def layer(self, i: int, start: int) -> SlotWrite:
        return SlotWrite(self.k[i], self.v[i], start, self.rope)


def rope_rows(table: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A DraftCache's RoPE table [P, 2D] and position_ids [B, T] -> (cos, signed sin), each [B, 1, T, D]:
    rope_tables' values by one lookup."""
    rows = table[position_ids][:, None]  # [B, 1, T, 2D]
    half = table.shape[-1] // 2
    return rows[..., :half], rows[..., half:]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the storage dtype, as HF/SGLang/vLLM RMSNorms do.
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig, in_features: int) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(in_features, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(in_features, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(in_features, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)
        # Decoding copies (fastcpu/draft.py) set one module computing q, k, v side by side: one GEMM
        # instead of three. Never saved: the checkpoint keeps the three projections engines load.
        self.qkv: nn.Module | None = None
        self.qkv_widths = [cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.num_key_value_heads * hd]

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, past: KV | SlotWrite | None
    ) -> tuple[torch.Tensor, KV]:
        """x: [B, T, in]; mask: bool [B, 1, T, S] (True = may attend) or None for plain causal."""
        b, t, _ = x.shape
        hd, theta = self.cfg.head_dim, self.cfg.rope_theta
        if self.qkv is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:  # [B, T, (heads + 2 kv_heads) * D] split into views
            q, k, v = self.qkv(x).split(self.qkv_widths, dim=-1)
        q = q.reshape(b, t, -1, hd).transpose(1, 2)  # [B, heads, T, D]
        if isinstance(past, SlotWrite):  # [B, 1, T, D] each, once for q and k
            cos, ssin = rope_rows(past.rope, position_ids)
        else:
            cos, ssin = rope_tables(position_ids, hd, theta, q.dtype)
        q, k = rotate(q, cos, ssin), rotate(k.reshape(b, t, -1, hd).transpose(1, 2), cos, ssin)
        v = v.reshape(b, t, -1, hd).transpose(1, 2)
        if isinstance(past, SlotWrite):  # decoding: static cache, no re-allocation
            end = past.start + t
            past.k[:b, :, past.start : end], past.v[:b, :, past.start : end] = k, v
            k, v = past.k[:b, :, :end], past.v[:b, :, :end]
            if mask is None and t > 1:  # one row sees every slot up to itself: SDPA unmasked is exactly that
                mask = torch.ones(t, end, dtype=torch.bool, device=x.device).tril(past.start)[None, None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        causal = mask is None and past is None
        if mask is None and past is not None and t > 1:
            raise ValueError("multi-token step on top of a cache needs an explicit mask")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: nn.Module | None = None  # decoding copies: gate and up side by side (one GEMM), never saved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [B, T, I] views of one [B, T, 2I] output
        return self.down_proj(F.silu(gate) * up)


class DraftLayer(nn.Module):
    """Layer 0 reads [input_layernorm(embeds) ; hidden_norm(hidden)]; later layers are plain."""

    def __init__(self, cfg: DraftConfig, first: bool) -> None:
        super().__init__()
        self.first, self.cfg = first, cfg
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * h if first else h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor | None,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        past: KV | SlotWrite | None,
    ) -> tuple[torch.Tensor, KV]:
        if self.first:
            normed = self.hidden_norm(hidden)
            # EAGLE-3 keeps the un-normed hidden as residual; speculators' norm_before_residual does not.
            residual = normed if self.cfg.norm.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        else:
            residual, x = hidden, self.input_layernorm(hidden)
        attn, kv = self.self_attn(x, position_ids, mask, past)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), kv


@dataclass
class DraftOutput:
    logits: torch.Tensor | None  # [B, T, V_d] over the draft vocabulary (None if not requested)
    hidden: torch.Tensor  # [B, T, H] what the next draft step is fed (pre- or post-norm per norm_output)
    normed: torch.Tensor  # [B, T, H] final-norm output: logits = lm_head(normed)
    kv: list[KV]  # per layer, keys/values including `past`


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, n, ht = cfg.hidden_size, cfg.num_taps, cfg.target_hidden_size
        # The target's embedding: frozen, attached with `attach_embedding`, not saved by default.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.embedding_attached = False  # step() refuses to run on a placeholder embedding
        self.contract: WiringContract | None = None  # the wiring it was trained for; set by the loaders
        if cfg.norm.norm_before_fc:
            self.input_norm = RMSNorm(n * ht, cfg.rms_norm_eps)
        if cfg.norm.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(ht, cfg.rms_norm_eps) for _ in range(n))
        self.fc = nn.Linear(n * ht, h, bias=False)
        self.layers = nn.ModuleList(DraftLayer(cfg, first=i == 0) for i in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.d2t: torch.Tensor  # [V_d] int64: target id of draft id i = i + d2t[i]
        self.t2d: torch.Tensor  # [V] bool: target ids the draft vocabulary holds
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # ---- initialisation ----------------------------------------------------------------------
    def init_random(self, seed: int = 0, std: float = 0.02) -> "Eagle3Draft":
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name == "embed_tokens.weight":
                continue
            with torch.no_grad():
                p.copy_(torch.ones_like(p) if p.dim() == 1 else torch.randn(p.shape, generator=g) * std)
        return self

    def fill_nan(self) -> "Eagle3Draft":
        """Must-load sentinel: any weight a loader forgets stays NaN and is caught, never used."""
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))
            self.d2t.fill_(-(2**62))
        return self

    def attach_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's input embedding [V, H] (shared storage, frozen)."""
        if tuple(weight.shape) != (self.cfg.vocab_size, self.cfg.hidden_size):
            raise CheckpointError(
                "target embedding has the wrong shape for this draft",
                expected=str((self.cfg.vocab_size, self.cfg.hidden_size)),
                found=str(tuple(weight.shape)),
            )
        self.embed_tokens.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.embedding_attached = True

    # ---- forward -----------------------------------------------------------------------------
    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [B, T, n*H_t] -> [B, T, H]. Refuses any other width, naming taps expected vs received."""
        n, ht = self.cfg.num_taps, self.cfg.target_hidden_size
        width = taps.shape[-1]
        if width != n * ht:
            got = f"{width // ht} tap(s) of width {ht}" if width % ht == 0 else f"not a multiple of {ht}"
            raise TapWidthError(
                "hidden states fed to the draft have the wrong width",
                expected=f"{n} taps x {ht} = {n * ht} channels (the concatenated target taps)",
                found=f"{width} channels = {got}",
                fix="the engine is not feeding the draft's taps: check eagle_aux_hidden_state_layer_ids "
                "and use_aux_hidden_state (run `eaglewire doctor`)",
            )
        if self.cfg.norm.norm_before_fc:
            taps = self.input_norm(taps)
        elif self.cfg.norm.fc_norm:
            taps = torch.cat([norm(c) for norm, c in zip(self.fc_norm, taps.split(ht, dim=-1))], dim=-1)
        return self.fc(taps)

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        past: list[KV] | None = None,
        *,
        compute_logits: bool = True,
        cache: DraftCache | None = None,
        start: int = 0,
    ) -> DraftOutput:
        """One draft pass on H-wide states (fused taps, or the draft's own previous output).

        input_ids [B, T] target ids (token t+1 paired with state t); hidden [B, T, H];
        position_ids [B, T] (default 0..T-1 after the cache); mask bool [B, 1, T, S] or None (causal).
        """
        if hidden.shape[-1] != self.cfg.hidden_size:
            raise TapWidthError(
                "draft step fed a state of the wrong width",
                expected=f"{self.cfg.hidden_size} (fused or the draft's own hidden)",
                found=str(hidden.shape[-1]),
                fix="pass target taps through forward()/fuse()",
            )
        if not self.embedding_attached:
            raise CheckpointError(
                "the draft has no input embedding attached",
                expected="the target's embedding (EAGLE-3 drafts share it, frozen)",
                found="a placeholder",
                fix="load with target=... or call attach_embedding()",
            )
        if position_ids is None:
            first = start if cache is not None else (0 if past is None else past[0][0].shape[2])
            position_ids = torch.arange(first, first + input_ids.shape[1], device=input_ids.device).expand(
                input_ids.shape[0], -1
            )
        embeds = self.embed_tokens(input_ids)
        kv: list[KV] = []
        h = hidden
        for i, layer in enumerate(self.layers):
            layer_past = cache.layer(i, start) if cache is not None else (past[i] if past else None)
            h, layer_kv = layer(h, embeds if i == 0 else None, position_ids, mask, layer_past)
            kv.append(layer_kv)
        normed = self.norm(h)
        # Training computes the head only where it is supervised (compute_logits=False): the V_d-wide head
        # is most of a small draft's cost.
        return DraftOutput(
            logits=self.lm_head(normed) if compute_logits else None,
            hidden=normed if self.cfg.norm.norm_output else h,
            normed=normed,
            kv=kv,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        taps: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        past: list[KV] | None = None,
        *,
        compute_logits: bool = True,
        cache: DraftCache | None = None,
        start: int = 0,
    ) -> DraftOutput:
        """First draft step from target taps [B, T, n*H_t]."""
        return self.step(
            input_ids,
            self.fuse(taps),
            position_ids,
            mask,
            past,
            compute_logits=compute_logits,
            cache=cache,
            start=start,
        )

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids -> target ids (d2t holds offsets)."""
        return draft_ids + self.d2t[draft_ids]
