"""A lean forward for Llama-family targets with a static KV cache and arbitrary (tree) attention masks.

Supported: Llama (SmolLM2), Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm per head). It reads the
weights of the loaded HF model (no copy of HF's modeling code) and reuses the model's own rotary
embedding module, so every RoPE scaling type HF supports is computed by HF.

Why it exists: for small row counts the GEMM's speed depends on how the weight is laid out, and the
fastest layout differs by row count, dtype and machine (research notes found `(W @ x.T).T` best for 2..16
rows; a later measurement here found `x @ W.t()` best there and `x @ Wt` best for 1 row; on an AMD EPYC with
AVX512-BF16, oneDNN's prepacked weight ran SmolLM2's GEMMs of 4-16 rows 2-3x faster than any MKL
orientation in fp32 and faster at every row count in bf16; a whole fp32 verify of 4 tokens took ~28 ms
against ~53 ms, 1 thread, contended machine). The runtime offers every candidate layout, `calibrate()`
measures each per row count, and every call uses the winner. q/k/v are one GEMM and gate/up another (one
weight each, the output split with views): one call per projection group instead of three or two. One
candidate, GRAPH (compiled_body.py), is not a GEMM layout alone: it runs the whole layer stack
(`layers_forward`) as one inductor graph, the small ops between the GEMMs fused.

`forward` returns logits (sampling needs them all); `greedy` returns each row's argmax, through the
fp32 head or its bf16 screen (screened_head.py: the same tokens, half the head's bytes), whichever the
calibration measured faster for that row count.

KV cache: [L, B, kv_heads, cache_slots(max_len), head_dim] (a spare slot or more), allocated once.
`forward(..., start=s)` writes the T new keys/values into slots s..s+T-1 and attends to slots [0, s+T)
under `mask`; positions (RoPE) are given per token, so tree nodes at the same depth share a position.
`commit(src, dst)` moves accepted tree slots into place with one gather + copy.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from eaglewire.fastcpu import panel_gemm
from eaglewire.fastcpu.compiled_body import (FUSED, FUSED_ROWS, GRAPH, GRAPH_GEMMS, INDUCTOR_LAYOUTS, CompiledBody,
                                              target_layouts)
from eaglewire.fastcpu.gemm import (REFINE_REPS, PACKED, PANELS, Linear, hold_only, initial_policy, pick,
                                     row_counts, time_layouts)
from eaglewire.fastcpu.screened_head import PLAIN, SCREENED, ScreenedHead, default_head, greedy_heads
from eaglewire.fastcpu.target_weights import Layer, find_rotary, head_dim, read_layer
from eaglewire.errors import TargetError
from eaglewire.hw import return_freed_memory
from eaglewire.ops import rms_norm, rotate, sdpa, signed_sin
from eaglewire.target.loader import Target

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]  # ops.sdpa's signature


CALIBRATION_KS, CALIBRATION_REPS = (1, 2, 3, 4, 8, 16, 32), 5  # verify row counts timed, repetitions each
# cached tokens each timed verify attends to (slots the calibration writes first): a decode's context, not a
# toy one. At 16 the eager "dnnl" layout beat "graph" for 2-64 rows by 0.3-1.5 ms, while on a 100-token cache
# in the same process "graph" was 2-4 ms faster (sitting 18, AMD EPYC, fp32; benchmarks/bench_verify.py)
CALIBRATION_PREFIX = 128


def additive_mask(mask: torch.Tensor | None, T: int, start: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor | None:
    """The attention mask every layer uses, built once per forward: None for one causal row (it sees all
    start+1 cached slots, exactly what SDPA does unmasked); else 0 / -inf in `dtype` [.., T, start+T],
    which SDPA would otherwise rebuild from a bool mask in each of the L layers."""
    if mask is None:
        if T == 1:
            return None
        mask = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(start)[None, None]
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))


class LeanTarget:
    def __init__(self, target: Target, max_len: int, batch: int = 1, layout: str = "auto", head: str = "auto",
                 compiled: bool = True) -> None:
        """layout: one of `target_layouts(target.dtype, compiled)` for every call, or "auto": tn for one row,
        nt otherwise, until `calibrate()` measures the fastest per row count on this machine. head: the
        greedy head (`greedy_heads(target.dtype)`: plain, or screened where offered) for every call, or
        "auto": the screened one where offered until `calibrate()` times both. compiled=False: only the
        eager layouts are candidates (no inductor compile at start-up: hf_runtime.make_runtime)."""
        cfg = target.text_config
        if cfg.model_type not in SUPPORTED:
            raise TargetError(f"the lean runtime does not support model_type {cfg.model_type!r}",
                              expected=" / ".join(SUPPORTED), found=cfg.model_type,
                              fix="use the HF fallback runtime (same results, slower)")
        self.compiled = compiled  # whether inductor layouts may be candidates (a proposer beside it follows)
        self.candidates = target_layouts(target.dtype, compiled)
        if layout != "auto" and layout not in self.candidates:
            raise TargetError(f"GEMM layout {layout!r} is not available here", expected=" / ".join(
                ("auto",) + self.candidates), found=layout, fix=_layout_fix(layout, target.dtype))
        self.target, self.cfg, self.max_len = target, cfg, max_len
        self.eps = float(cfg.rms_norm_eps)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = head_dim(cfg)
        self.layers = [read_layer(m, self.candidates) for m in target.layers]
        self.norm = target.final_norm.weight.detach()
        self.embed = target.embed_tokens.weight.detach()
        self.head = Linear(target.model.get_output_embeddings().weight, None, self.candidates)
        self.policy: dict[int, str] = initial_policy(layout)
        # the graph's GEMM for two or more rows: the first offered of GRAPH_GEMMS (a panel GEMM, else oneDNN's)
        # until calibrate() times them (_calibrate_graph_gemm)
        self.graph_gemm = next(g for g in GRAPH_GEMMS if g in self.candidates + (PACKED,))
        self.graph_gemm_ms: dict[int, dict[str, float]] = {}  # {rows: {gemm: median ms}} of the last calibrate()
        self.graph = CompiledBody(self, self.graph_gemm) if GRAPH in self.candidates else None  # compiles on first use
        self.head_candidates = greedy_heads(target.dtype)
        if head != "auto" and head not in self.head_candidates:
            raise TargetError(f"greedy head {head!r} is not available here", expected=" / ".join(
                ("auto",) + self.head_candidates), found=head, fix="the screened head needs an fp32 target, a torch "
                "build with oneDNN and a CPU with native bf16" if head == SCREENED else None)
        # the greedy head's bf16 screen (screened_head.py), where it is offered and may be used
        self.screen_usable = SCREENED in self.head_candidates and head in ("auto", SCREENED)
        self.screen = self._new_screen() if self.screen_usable else None
        self.head_policy: dict[int, str] = {1: default_head(self.head_candidates) if head == "auto" else head}
        self.head_ms: dict[int, dict[str, float]] = {}  # {rows: {head: median ms}} of the last calibrate()
        self.calibration_ms: dict[int, dict[str, float]] = {}  # {rows: {layout: median ms}} of the last calibrate()
        self.fused_ms: dict[int, dict[str, float]] = {}  # {rows: {GRAPH or FUSED: median ms}} of compile_graphs()
        self.rotary = find_rotary(target)
        p = self.embed
        shape = (len(self.layers), batch, self.kv_heads, cache_slots(max_len, self.graph is not None), self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        # per-layer views, taken once: a step indexes each layer's cache four times, and every index op is a
        # few microseconds of dispatch on a CPU (30 layers: ~250 ops a step saved against k_cache[i, :B, ...])
        self.k_layers, self.v_layers = list(self.k_cache.unbind(0)), list(self.v_cache.unbind(0))

    def layout(self, rows: int) -> str:
        """The layout measured (or assumed) fastest for the largest calibrated row count <= rows."""
        return pick(self.policy, rows)

    def eager_layout(self, rows: int) -> str:
        """The layout of a GEMM outside the layer stack (the head, a prefill): GRAPH's own GEMM for several
        rows stands in for it (the panel GEMM where offered, else oneDNN's packed one). A long prefill
        through the panel GEMM costs what it costs through oneDNN's (sitting 23, AVX2 host, whole eager
        forwards of 100 / 300 tokens: 240 / 705 ms against 244 / 688), though it reads each panel once per 8
        rows."""
        lay = self.layout(rows)
        return self.graph_gemm if lay == GRAPH else lay

    def set_graph_gemm(self, gemm: str) -> None:
        """Make `gemm` (compiled_body.GRAPH_GEMMS, offered here) the graph's multi-row GEMM; a change gets a
        new CompiledBody (its graphs compile anew: the old ones do not guard on this choice)."""
        if gemm not in GRAPH_GEMMS or gemm not in self.candidates or self.graph is None:
            raise ValueError(f"the graph's GEMM {gemm!r} is not offered here (graph: {self.graph is not None}, "
                             f"candidates {self.candidates})")
        if gemm != self.graph_gemm:
            self.graph_gemm, self.graph = gemm, CompiledBody(self, gemm)

    def linears(self) -> list[Linear]:
        """Every GEMM weight of the runtime: the layers' and the head."""
        return [lin for L in self.layers for lin in (L.qkv, L.o, L.gate_up, L.down)] + [self.head]

    def used_layouts(self) -> set[str]:
        """The GEMM layouts this runtime's calls reach under its policy: each calibrated row count's
        layout, GRAPH's own multi-row GEMM standing in for it (`eager_layout`: the graph's, the head's and a
        prefill's); the graph's one-row GEMV and the compiled GEMVs read W."""
        return {self.eager_layout(k) for k in self.policy}

    def settle_copies(self) -> int:
        """Hold exactly the weight copies the policy reads: build those of `used_layouts()` not built yet
        (a start that reused a cached calibration has built none) and free the rest (Linear.keep); hold the
        greedy head's bf16 screen where the head policy picks it, else free it. Returns the bytes freed. Why: every
        candidate layout has its own copy of every weight while a calibration times them (about 4x the
        weights); decoding reads one or two (make_runtime calls this once the policy is set, before
        compiling). `calibrate` builds what it times."""
        freed = hold_only(self.linears(), self.used_layouts())
        if self.screen is not None and SCREENED not in self.head_policy.values():
            freed += self.screen.nbytes()
            self.screen = None
        elif self.screen is None and self.screen_usable and SCREENED in self.head_policy.values():
            self.screen = self._new_screen()  # freed before, picked now
        if self.graph is not None:
            self.graph.prepared = False  # its GEMM's copies checked again at its next call
        if freed:
            return_freed_memory()
        return freed

    def prepare_copies(self, layouts: tuple[str, ...] | None = None) -> None:
        """Build every weight's copies for `layouts` (None: every candidate, and the head's screen where
        offered): a calibration times them all."""
        for lin in self.linears():
            lin.prepare(self.candidates if layouts is None else layouts)
        if layouts is None and self.screen is None and self.screen_usable:
            self.screen = self._new_screen()

    def _new_screen(self) -> ScreenedHead:
        return ScreenedHead(self.head.w, packed=True)  # offered only where bf16 runs natively: packed

    @torch.no_grad()
    def calibrate(self, ks: tuple[int, ...] = CALIBRATION_KS, reps: int = CALIBRATION_REPS,
                  refine: int = REFINE_REPS) -> dict[int, str]:
        """Time a whole verify forward per layout and row count on this machine; keep the fastest.
        Small-M GEMM speed depends on the weight's layout, and which one wins differs between machines.
        The medians are kept in `calibration_ms` {rows: {layout: ms}} (decoding/calibration.py stores them).
        refine: repetitions more for a close runner-up (gemm.time_layouts)."""
        prefix, ks = CALIBRATION_PREFIX, row_counts(ks, self.candidates)
        if prefix + max(ks) > self.max_len:
            raise ValueError(f"calibrate() writes {prefix}+{max(ks)} cache slots; this runtime has max_len "
                             f"{self.max_len} (make_runtime allocates the room)")

        dev = self.embed.device
        inputs = {k: (torch.zeros(1, k, dtype=torch.long, device=dev), torch.arange(prefix, prefix + k, device=dev)[None])
                  for k in ks}  # built before timing: [1, k] ids and positions after the prefix

        def run(layout: str, k: int) -> None:
            self.policy = {1: layout}
            self.forward(*inputs[k], prefix)

        self.prepare_copies()
        self._calibrate_graph_gemm(ks, reps, refine)  # before the graph is timed: it runs the chosen GEMM
        self.policy, self.calibration_ms = time_layouts(self.candidates, ks, reps, run, refine=refine)
        self._calibrate_head(inputs, prefix, reps, refine)
        return self.policy

    def _calibrate_graph_gemm(self, ks: tuple[int, ...], reps: int, refine: int) -> None:
        """Time the layer stack's GEMMs alone through each GEMM the graph can run for several rows (the
        panel GEMM, oneDNN's), at the calibration's row counts from 2 to 16 (verify sizes), and give the
        graph the one faster at most of them by ratio (geometric mean: a 16-row product's milliseconds
        do not outvote 4 rows'). Why measured: where oneDNN has AVX-512 kernels its few-row GEMMs may beat
        a panel kernel (sitting 17's AVX-512 host: 13.0 ms for 8 rows over the body weights, near the memory
        floor), and an AVX-512 host offers two panel kernels, the wider one unmeasured so far."""
        rows = tuple(k for k in ks if 2 <= k <= 16)
        gemms = tuple(g for g in GRAPH_GEMMS if g in self.candidates)
        if self.graph is None or not rows or len(gemms) < 2:
            return
        lins = self.linears()[:-1]  # the layer stack's (the graph's); not the head
        xs = {k: {n: torch.zeros(1, k, n, dtype=self.embed.dtype) for n in {lin.w.shape[1] for lin in lins}}
              for k in rows}  # [1, k, in] per input width

        def run(gemm: str, k: int) -> None:
            for lin in lins:
                lin(xs[k][lin.w.shape[1]], gemm)

        _, self.graph_gemm_ms = time_layouts(gemms, rows, reps, run, refine=refine)
        score = {g: sum(math.log(self.graph_gemm_ms[k][g]) for k in rows) for g in gemms}
        self.set_graph_gemm(min(score, key=score.get))

    @torch.no_grad()
    def compile_graphs(self, verify_rows: tuple[int, ...] = ()) -> list[int]:
        """Run one forward of each row class the policy gives an inductor layout (GRAPH: one row, several;
        the compiled GEMV: one row), so that it is compiled (or loaded from inductor's cache) now rather
        than inside the first request; then, for each of `verify_rows` (the verify sizes the caller's
        proposers use) in FUSED_ROWS that the policy runs through GRAPH, build its static fused graph and
        keep it where it times faster than the shared one (`fused_ms` has the medians), unless the panel
        GEMM is the graph's (then no fused graph is built). Only the sizes
        asked for compile, each once per machine and cache size: about 40 s on a cold AVX-512 host; on
        sitting 22's AVX2 host 80-90 s (5 and 8 rows), 66-121 s with the graph's C++ wrapper (3 and 4 rows).
        Returns the row counts run. The slots written (after CALIBRATION_PREFIX) are overwritten by any
        prefill."""
        rows = sorted({min(k, 2) for k in self.policy if self.layout(k) in INDUCTOR_LAYOUTS
                       and CALIBRATION_PREFIX + min(k, 2) <= self.max_len})
        dev = self.embed.device

        def run(k: int) -> None:
            self.forward(torch.zeros(1, k, dtype=torch.long, device=dev),
                         torch.arange(CALIBRATION_PREFIX, CALIBRATION_PREFIX + k, device=dev)[None], CALIBRATION_PREFIX)

        for k in rows:
            run(k)
        # where the shared graph runs the panel GEMM, no fused graph is built: on sitting
        # 23's AVX2 host the fused graphs lost to it at every size timed (2 / 3 / 4 / 8 rows 22.6 / 24.1 /
        # 24.7 / 37.4 against 21.2 / 19.3 / 21.8 / 31.4 ms), and each costs one to two minutes of compile
        fused_sizes = () if self.graph_gemm in PANELS else sorted(set(verify_rows))
        for k in fused_sizes:
            if (self.graph is None or k not in FUSED_ROWS or self.layout(k) != GRAPH
                    or CALIBRATION_PREFIX + k > self.max_len):
                continue

            def variant(name: str, k: int) -> None:
                (self.graph.fused.add if name == FUSED else self.graph.fused.discard)(k)
                run(k)

            best, ms = time_layouts((GRAPH, FUSED), (k,), CALIBRATION_REPS, variant)
            variant(best[k], k)  # leaves the faster one chosen
            self.fused_ms[k] = ms[k]
            rows.append(k)
        return rows

    def _calibrate_head(self, inputs: dict[int, tuple[torch.Tensor, torch.Tensor]], prefix: int, reps: int,
                        refine: int) -> None:
        """Time the greedy head both ways (plain fp32 argmax, bf16 screen + recompute) on the final-norm
        states of the calibration's own forwards (real states: the screen's cost depends on how many
        tokens it keeps); keep the faster per row count. Both give the fp32 argmax: this is speed only."""
        heads = self.head_candidates if self.screen is not None else (PLAIN,)
        states = {k: self.hidden(*inp, prefix)[0] for k, inp in inputs.items()}  # [1, k, H] each

        def run(head: str, k: int) -> None:
            self.head_policy = {1: head}
            self.argmax(states[k])

        self.head_policy, self.head_ms = time_layouts(heads, tuple(inputs), reps, run, refine=refine)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
                taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [B, T]; mask bool [B, 1, T, start+T] (None = causal over the cache);
        returns (logits [B, T, V] or [B, R, V] for logit_rows [R], taps [B, T, n*H] or None)."""
        h, tapped = self.hidden(ids, positions, start, mask, taps, logit_rows)
        return self.head(h, self.eager_layout(h.shape[0] * h.shape[1])), tapped

    @torch.no_grad()
    def greedy(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
               taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward's arguments; returns (the argmax token of each row [B, T] or [B, R], taps): what greedy
        decoding needs, through the screened head where the calibration chose it."""
        h, tapped = self.hidden(ids, positions, start, mask, taps, logit_rows)
        return self.argmax(h), tapped

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """Final-norm states [B, R, H] -> the fp32 head's argmax [B, R] (exact either way: screened_head.py)."""
        rows = h.shape[0] * h.shape[1]
        if self.screen is not None and pick(self.head_policy, rows) == SCREENED:
            return self.screen.argmax(h)
        return self.head(h, self.eager_layout(rows)).argmax(-1)

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
               taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward without the head: (final-norm states [B, T or R, H], taps [B, T, n*H] or None)."""
        B, T = ids.shape
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start}+{T} > max_len {self.max_len}")
        mask = additive_mask(mask, T, start, self.embed.dtype, ids.device)
        cos, sin = self.rotary(self.embed[:1][None], positions)  # [B, T, D] each, computed by HF
        cos, sin = cos[:, None], signed_sin(sin[:, None])
        h = self.embed[ids]  # [B, T, H]
        lay = self.layout(B * T)
        if lay == GRAPH and start > 0:  # a prefill runs eager: traced at start 0, inductor specialises on it
            h, tapped = self.graph(h, cos, sin, start, mask, taps)
        else:
            eager = self.eager_layout(B * T)
            h, tapped = self.layers_forward(h, cos, sin, start, mask, taps, lambda lin, x: lin(x, eager), sdpa)
        h = rms_norm(h if logit_rows is None else h[:, logit_rows], self.norm, self.eps)
        return h, tapped

    def layers_forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                       mask: torch.Tensor | None, taps: tuple[int, ...],
                       linear: Callable[[Linear, torch.Tensor], torch.Tensor],
                       attend: Attend) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder layers on embeddings h [B, T, H] (cos, sin [B, 1, T, D]; mask additive or None):
        (the last layer's output [B, T, H], before the final norm; taps [B, T, n*H] or None). `linear(lin,
        x)` runs each GEMM: an eager layout's, or compiled_body.graph_linear when this is traced; `attend`
        the attention (ops.sdpa, or compiled_body.graph_attention when traced)."""
        collected = [h] if 0 in taps else []
        for i, L in enumerate(self.layers):
            h = h + self._attention(L, i, rms_norm(h, L.ln1, self.eps), cos, sin, start, mask, linear, attend)
            x = rms_norm(h, L.ln2, self.eps)
            gate, up = linear(L.gate_up, x).chunk(2, dim=-1)  # [B, T, I] views of one [B, T, 2I] GEMM output
            h = h + linear(L.down, F.silu(gate) * up)
            if i + 1 in taps:
                collected.append(h)
        return h, (torch.cat(collected, dim=-1) if taps else None)

    def _attention(self, L: Layer, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                   mask: torch.Tensor | None, linear: Callable[[Linear, torch.Tensor], torch.Tensor],
                   attend: Attend) -> torch.Tensor:
        B, T, _ = x.shape
        hd = self.head_dim
        qkv = linear(L.qkv, x)  # [B, T, (heads + 2 kv_heads) * D]
        nq = self.heads + self.kv_heads
        if L.q_norm is None:  # q and k are adjacent columns: one RoPE over both, split after
            qk = rotate(qkv[..., :nq * hd].view(B, T, nq, hd).transpose(1, 2), cos, sin)  # [B, nq, T, D]
            q, k = qk[:, :self.heads], qk[:, self.heads:]
        else:  # Qwen3: RMSNorm over each head (its own weight for q and for k) before RoPE
            q = rms_norm(qkv[..., :self.heads * hd].view(B, T, self.heads, hd), L.q_norm, self.eps)
            k = rms_norm(qkv[..., self.heads * hd:nq * hd].view(B, T, self.kv_heads, hd), L.k_norm, self.eps)
            q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        v = qkv[..., nq * hd:].view(B, T, self.kv_heads, hd).transpose(1, 2)
        kc, vc = self.k_layers[i], self.v_layers[i]  # [batch, kv_heads, max_len, D]
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


def _layout_fix(layout: str, dtype: torch.dtype) -> str | None:
    """How to get an unavailable layout, where we know."""
    if layout == PACKED:
        return "dnnl needs a torch build with oneDNN (mkldnn) and, in bf16, a CPU with native bf16"
    if layout in PANELS:
        why = ("it is fp32 only" if dtype != torch.float32 else panel_gemm.missing(PANELS[layout])
               or "see the line on stderr")
        return f"the {layout} GEMM is not offered here: {why}"
    return None


def cache_slots(max_len: int, graph: bool) -> int:
    """KV cache slots for a runtime of max_len tokens: at least one spare slot, never written, so that no
    forward's view of the cache spans all of it (a length a compiled graph would specialise on instead of
    keeping it dynamic). With GRAPH on offer, rounded up to a power of two (256 at least): the cache's
    size is part of the compiled graph (made dynamic, its tracing took 75 s a start against 3 s), and
    make_runtime sizes the runtime per request, so every new size would compile anew (~30 s a graph)."""
    return max(256, 1 << max_len.bit_length()) if graph else max_len + 1
