"""The DFlash block drafter (z-lab, arXiv 2602.06036), written from the paper's reference behaviour.

    ctx   = hidden_norm(fc(concat taps))                          [N, S, H]   the target's earlier positions
    x     = embed([anchor, MASK x (B-1)])                         [N, Q, H]   the target's frozen embedding
    every layer (Qwen3-style: pre-norm, SwiGLU, per-head q/k RMSNorm):
        q     = rope(q_norm(q_proj(input_layernorm(x))))           queries from the block only
        k, v  = [k_proj(ctx) ; k_proj(xn)], [v_proj(ctx) ; v_proj(xn)]   the context is NOT input-normed
        k     = rope(k_norm(k))                                    neox RoPE at absolute positions
        x     = x + o_proj(attn(q, k, v, mask));  x = x + mlp(post_attention_layernorm(x))
    hidden = norm(x);  logits = target_head(hidden)                full vocabulary, no d2t
                   or lm_head(hidden)                            a reduced vocabulary: the draft's own head
                                                                 [V_d, H], target id = i + d2t[i]

Attention inside a block is bidirectional in full-attention layers; a contract's BlockWiring can make layers
causal in the block or sliding-window (`layer_mask`). The state dict is exactly z-lab's HF layout (no
embedding, no head: both are the target's, attached frozen); a reduced-vocabulary draft adds `lm_head.weight`,
`d2t` and `t2d`, the names vLLM's DFlash loader and speculators' DFlash model read. Because k_norm and RoPE act
per position, the context's keys/values of each layer can be computed once and cached (`DFlashCache`): decoding extends the
cache with the accepted positions' taps and runs one block pass per round.

The contract a DFlash draft is wired by (its block, mask token and default taps) is made in draft/dflash_contract.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.model import MLP, RMSNorm, rope_rows
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import CheckpointError, ContractMismatch, TapWidthError
from eaglewire.families import SLIDING, BlockWiring
from eaglewire.ops import rope_tables, rotate
from eaglewire.target.protocol import TargetTensors

KV = tuple[torch.Tensor, torch.Tensor]  # ([N, kv_heads, S, D], same)


class BlockAttention(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg, hd = cfg, cfg.head_dim
        h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(h, heads * hd, bias=False)
        self.k_proj = nn.Linear(h, kv * hd, bias=False)
        self.v_proj = nn.Linear(h, kv * hd, bias=False)
        self.o_proj = nn.Linear(heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)  # per head, as Qwen3
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> KV:
        """Keys and values of x [N, T, H] (context states or normed block tokens) at the positions whose RoPE
        rows cos, ssin [N, 1, T, D] are: ([N, kv, T, D], [N, kv, T, D])."""
        n, t, _ = x.shape
        hd = self.cfg.head_dim
        k = self.k_norm(self.k_proj(x).view(n, t, -1, hd)).transpose(1, 2)
        v = self.v_proj(x).view(n, t, -1, hd).transpose(1, 2)
        return rotate(k, cos, ssin), v

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor, ctx: KV, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """x [N, Q, H] (input-normed block); ctx: the context's keys/values [N, kv, S, D];
        mask bool [N, 1, Q, S+Q] (True = may attend) or None (every key) -> [N, Q, H]."""
        n, q_len, _ = x.shape
        hd = self.cfg.head_dim
        q = rotate(self.q_norm(self.q_proj(x).view(n, q_len, -1, hd)).transpose(1, 2), cos, ssin)
        k, v = self.kv(x, cos, ssin)
        k, v = torch.cat([ctx[0], k], dim=2), torch.cat([ctx[1], v], dim=2)  # [N, kv, S+Q, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [N, heads, Q, D]
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, -1))


class BlockLayer(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor, ctx: KV, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, ssin, ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashCache:
    """The context keys/values of every draft layer for one sequence, allocated once
    ([layers, 1, kv_heads, max_len, D]), and the RoPE rows of every position it can hold. Slot j holds
    target position j; `n` slots are filled."""

    def __init__(
        self, cfg: DraftConfig, max_len: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        shape = (cfg.num_layers, 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        self.max_len, self.n = max_len, 0
        cos, ssin = rope_tables(torch.arange(max_len, device=device)[None], cfg.head_dim, cfg.rope_theta, dtype)
        self.rope = torch.cat([cos[0, 0], ssin[0, 0]], dim=-1)  # [max_len, 2D]


class DFlashDraft(nn.Module):
    """A block drafter wired as its contract says: the block (size, mask token, anchor layout, attention) is
    read from `contract.block`, the one place it is held, so the draft and its contract cannot disagree."""

    def __init__(self, cfg: DraftConfig, contract: WiringContract) -> None:
        super().__init__()
        if contract.block is None:
            raise ContractMismatch(
                "a DFlash draft needs block wiring in its contract",
                expected="a contract with block wiring (family 'dflash')",
                found=f"family={contract.family!r}, no block",
                fix="make the contract with dflash_contract()",
            )
        if not 0 < cfg.draft_vocab_size <= cfg.vocab_size:
            raise CheckpointError(
                "a DFlash draft's vocabulary must be the target's or a part of it",
                expected=f"0 < draft_vocab_size <= vocab_size = {cfg.vocab_size}",
                found=f"draft_vocab_size={cfg.draft_vocab_size}",
            )
        contract.block.layer_types(cfg.num_layers)  # refuses sliding-layer indices beyond the draft's layers
        self.cfg = cfg
        self.contract: WiringContract = contract  # the wiring, the block included; the loaders replace it
        self.fc = nn.Linear(cfg.num_taps * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # The target's embedding [V, H] and head [V, H]: frozen, attached, never in the state dict (plain
        # attributes, not parameters or buffers), as z-lab's checkpoints hold neither.
        self.embed_weight: torch.Tensor | None = None
        self.head_weight: torch.Tensor | None = None
        # A reduced vocabulary predicts V_d < V ids through its own head, started from the target's rows
        self.reduced = cfg.draft_vocab_size < cfg.vocab_size
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False) if self.reduced else None
        if self.reduced:
            self.d2t: torch.Tensor  # [V_d] int64 offsets: target id of draft id i = i + d2t[i]
            self.t2d: torch.Tensor  # [V] bool: the target ids the draft vocabulary holds
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    @property
    def block(self) -> BlockWiring:
        """The block wiring, read from the contract (its one holder)."""
        block = self.contract.block
        if block is None:
            raise ContractMismatch(
                "this DFlash draft's contract lost its block wiring",
                expected="contract.block",
                found=f"family={self.contract.family!r}, no block",
                fix="attach the draft's own contract (a dflash one)",
            )
        return block

    # ---- initialisation ----------------------------------------------------------------------
    def init_random(self, seed: int = 0, std: float = 0.02) -> "DFlashDraft":
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.ones_like(p) if p.dim() == 1 else torch.randn(p.shape, generator=g) * std)
        return self

    def fill_nan(self) -> "DFlashDraft":
        """Must-load sentinel: any weight a loader forgets stays NaN and is caught, never used."""
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))
            if self.reduced:
                self.d2t.fill_(-(2**62))
        return self

    def set_vocab(self, vmap: VocabMap, head: torch.Tensor | None = None) -> None:
        """A reduced-vocabulary draft's map, and its head started as the target's rows `head[target ids]` [V_d, H]
        when the target's head [V, H] is given."""
        if not self.reduced or vmap.draft_vocab_size != self.cfg.draft_vocab_size:
            raise CheckpointError(
                "the vocab map does not fit this DFlash draft",
                expected=f"V_d = {self.cfg.draft_vocab_size} < V = {self.cfg.vocab_size}",
                found=f"V_d = {vmap.draft_vocab_size}",
                fix="build the draft for this vocab map",
            )
        assert self.lm_head is not None
        with torch.no_grad():
            self.d2t.copy_(vmap.d2t)
            self.t2d.copy_(vmap.t2d)
            if head is not None:
                self.lm_head.weight.copy_(head[vmap.target_ids.to(head.device)])

    def target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Ids of `logits`' last axis -> target ids (draft id i is i + d2t[i]; the full vocabulary's are)."""
        return ids + self.d2t[ids] if self.reduced else ids

    def attach_target(self, embedding: torch.Tensor, head: torch.Tensor) -> None:
        """Use the target's input embedding and output head, each [V, H] (shared storage, frozen)."""
        want = (self.cfg.vocab_size, self.cfg.hidden_size)
        for name, w in (("embedding", embedding), ("head", head)):
            if tuple(w.shape) != want:
                raise CheckpointError(
                    f"target {name} has the wrong shape for this draft", expected=str(want), found=str(tuple(w.shape))
                )
        self.embed_weight, self.head_weight = embedding.detach(), head.detach()

    def move_attached(self, device: torch.device | str) -> None:
        """The attached target embedding and head moved to `device` (a copy where they live elsewhere: a target
        spread over GPUs, a draft scored on the CPU). They are plain attributes, which Module.to leaves alone."""
        if self.embed_weight is not None and self.head_weight is not None:
            self.embed_weight, self.head_weight = self.embed_weight.to(device), self.head_weight.to(device)

    def _attached(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.embed_weight is None or self.head_weight is None:
            raise CheckpointError(
                "the DFlash draft has no target embedding/head attached",
                expected="the target's (a DFlash draft shares both, frozen)",
                found="none",
                fix="build it with build_dflash_draft, load it with target=..., or attach_target()",
            )
        return self.embed_weight, self.head_weight

    # ---- pieces ------------------------------------------------------------------------------
    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [N, S, n*H_t] -> the context states [N, S, H]; any other width is refused."""
        n, ht = self.cfg.num_taps, self.cfg.target_hidden_size
        if taps.shape[-1] != n * ht:
            raise TapWidthError(
                "target taps fed to the DFlash draft have the wrong width",
                expected=f"{n} taps x {ht} = {n * ht} channels",
                found=f"{taps.shape[-1]} channels",
                fix="feed the taps the draft's contract names (run `eaglewire doctor`)",
            )
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.device, self.fc.weight.dtype)))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self._attached()[0]).to(self.fc.weight.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-norm states [..., H] -> logits [..., V] through the target's head, or [..., V_d] through the
        draft's own (`target_ids` maps an argmax back)."""
        head = self.lm_head.weight if self.lm_head is not None else self._attached()[1]
        return F.linear(hidden.to(head.dtype), head)

    def layer_masks(
        self, mask: torch.Tensor | None, kv_pos: torch.Tensor, q_pos: torch.Tensor
    ) -> list[torch.Tensor | None]:
        """Each layer's mask from the full-attention one: mask bool [N, 1, Q, S+Q] or None (every key),
        kv_pos [N, S+Q], q_pos [N, Q]. Sliding layers add query - key < sliding_window; causal ones (per the
        block wiring: sliding layers unless `causal` overrides) key position <= query position."""
        causal = kv_pos[:, None, None, :] <= q_pos[:, None, :, None]  # [N, 1, Q, S+Q]
        window = q_pos[:, None, :, None] - kv_pos[:, None, None, :] < (self.block.sliding_window or 0)
        base = mask if mask is not None else torch.ones_like(causal)
        out = []
        for kind in self.block.layer_types(self.cfg.num_layers):
            sliding = kind == SLIDING
            m = base & window if sliding else mask
            is_causal = sliding if self.block.causal is None else self.block.causal
            out.append(m & causal if is_causal else m)
        return out

    def _rope(self, pos: torch.Tensor, table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if table is not None:
            return rope_rows(table, pos)
        return rope_tables(pos, self.cfg.head_dim, self.cfg.rope_theta, self.fc.weight.dtype)

    # ---- training-time forward ---------------------------------------------------------------
    def forward(
        self,
        ctx_taps: torch.Tensor,
        ctx_pos: torch.Tensor,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """ctx_taps [N, S, n*H_t], ctx_pos [N, S] long, block_ids [N, Q] long, block_pos [N, Q] long,
        mask [N, Q, S+Q] bool (True = may attend; keys are the S context positions then the Q block tokens)
        -> hidden [N, Q, H] after the draft's final norm (`logits(hidden)` gives [N, Q, V])."""
        N, S, Q = ctx_taps.shape[0], ctx_taps.shape[1], block_ids.shape[1]
        if tuple(mask.shape) != (N, Q, S + Q):
            raise ValueError(f"mask must be [N, Q, S+Q] = {[N, Q, S + Q]}, got {list(mask.shape)}")
        if not bool(mask.any(-1).all()):  # SDPA gives NaN for a row that sees nothing
            raise ValueError("every block row must be allowed to attend at least one key (e.g. itself)")
        ctx = self.context(ctx_taps)
        ccos, cssin = self._rope(ctx_pos)
        qcos, qssin = self._rope(block_pos)
        masks = self.layer_masks(mask[:, None], torch.cat([ctx_pos, block_pos], dim=1), block_pos)
        x = self.embed(block_ids)
        for layer, m in zip(self.layers, masks):
            x = layer(x, qcos, qssin, layer.self_attn.kv(ctx, ccos, cssin), m)
        return self.norm(x)

    # ---- decoding: a static context cache, one block pass per round --------------------------
    def new_cache(self, max_len: int) -> DFlashCache:
        return DFlashCache(self.cfg, max_len, self.fc.weight.dtype, self.fc.weight.device)

    @torch.no_grad()
    def extend_context(self, cache: DFlashCache, taps: torch.Tensor) -> None:
        """Append target positions cache.n .. cache.n+T-1 from their taps [1, T, n*H_t]."""
        t = taps.shape[1]
        if cache.n + t > cache.max_len:
            raise ValueError(f"DFlash context cache full: {cache.n}+{t} > {cache.max_len}")
        ctx = self.context(taps)
        cos, ssin = rope_rows(cache.rope, torch.arange(cache.n, cache.n + t, device=cache.k.device)[None])
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, cos, ssin)
            cache.k[i, :, :, cache.n : cache.n + t], cache.v[i, :, :, cache.n : cache.n + t] = k, v
        cache.n += t

    @torch.no_grad()
    def draft_block(self, cache: DFlashCache, anchor: int) -> torch.Tensor:
        """One draft pass over [anchor, MASK x (B-1)] at positions n..n+B-1 (n = cache.n: the anchor is the
        pending token, not yet in the context) -> final-norm states [1, B, H]."""
        B, n = self.block.block_size, cache.n
        dev = cache.k.device
        ids = torch.full((1, B), self.block.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor
        pos = torch.arange(n, n + B, device=dev)[None]  # [1, B]
        if n + B > cache.max_len:
            raise ValueError(f"DFlash context cache too small for a block at {n}: max_len {cache.max_len}")
        cos, ssin = rope_rows(cache.rope, pos)
        masks = self.layer_masks(None, torch.arange(n + B, device=dev)[None], pos)
        x = self.embed(ids)
        for i, (layer, m) in enumerate(zip(self.layers, masks)):
            x = layer(x, cos, ssin, (cache.k[i, :, :, :n], cache.v[i, :, :, :n]), m)
        return self.norm(x)


def build_dflash_draft(
    target: TargetTensors, contract: WiringContract, num_layers: int, *, seed: int = 0, vmap: VocabMap | None = None
) -> DFlashDraft:
    """A random DFlash draft for `target` (a TargetInfo with text_config, head_rows and final_norm_weight):
    architecture from the target (hidden size, heads, MLP width, RoPE base), its final norm started from the
    target's (the head it shares then reads states of the scale it was trained on), the target's embedding
    and head attached, `contract` attached. With `vmap` (the contract's reduced vocabulary) its own head
    starts as the target head's rows of the kept ids."""
    if contract.block is None:
        raise CheckpointError(
            "a DFlash draft needs a block-drafter contract",
            expected="contract.family='dflash'",
            found=f"family={contract.family!r}",
            fix="make the contract with dflash_contract()",
        )
    cfg = DraftConfig.from_target(target.text_config, contract, num_layers=num_layers)
    draft = DFlashDraft(cfg, contract).init_random(seed)
    norm_w = target.final_norm_weight()
    if norm_w is not None and tuple(norm_w.shape) == tuple(draft.norm.weight.shape):
        with torch.no_grad():
            draft.norm.weight.copy_(norm_w)
    draft.attach_target(target.embedding(), target.head_rows())
    if draft.reduced:
        if vmap is None or vmap.sha256() != contract.vocab_map_sha256:
            raise CheckpointError(
                "a reduced-vocabulary DFlash draft needs its contract's vocab map",
                expected=f"vocab_map_sha256={contract.vocab_map_sha256}",
                found="none" if vmap is None else vmap.sha256(),
                fix="pass the map the contract names",
            )
        draft.set_vocab(vmap, target.head_rows())
    draft.contract = contract
    return draft
