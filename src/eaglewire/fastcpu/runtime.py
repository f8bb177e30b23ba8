"""The accelerated target runtime: StaticRuntime with every GEMM in the layout measured fastest on the machine.

For a few rows a GEMM's speed depends on how its weight is laid out, and the fastest layout differs by row
count, dtype and machine (benchmarks/decoding/bench_verify.py and benchmarks/decoding/bench_gemm.py measure them). The
runtime offers every candidate layout (gemm.py), `calibrate()` measures each per row count, and every
call uses the winner. One candidate, GRAPH (compiled_body.py), is not a GEMM layout alone: it runs the
whole layer stack (`layers_forward`, the base class's code) as one inductor graph, the small ops between
the GEMMs fused. `greedy` goes through the fp32 head or its bf16 screen (screened_head.py: the same
tokens, half the head's bytes), whichever the calibration measured faster for that row count.
"""

from __future__ import annotations

import math

import torch

from eaglewire.decoding.runtime import Out, StaticRuntime
from eaglewire.errors import TargetError
from eaglewire.fastcpu import panel_gemm
from eaglewire.fastcpu.compiled_body import (
    FUSED,
    FUSED_ROWS,
    GRAPH,
    GRAPH_GEMMS,
    INDUCTOR_LAYOUTS,
    CompiledBody,
    target_layouts,
)
from eaglewire.fastcpu.gemm import (
    REFINE_REPS,
    PACKED,
    PANELS,
    Gemm,
    hold_only,
    initial_policy,
    pick,
    row_counts,
    time_layouts,
)
from eaglewire.fastcpu.screened_head import PLAIN, SCREENED, ScreenedHead, default_head, greedy_heads
from eaglewire.hw import return_freed_memory
from eaglewire.ops import sdpa
from eaglewire.target.loader import Target

CALIBRATION_KS, CALIBRATION_REPS = (1, 2, 3, 4, 8, 16, 32), 5  # verify row counts timed, repetitions each
# cached tokens each timed verify attends to (slots the calibration writes first): a decode's context, not a
# toy one: which layout wins depends on the cache length, so a calibration on a near-empty cache can rank
# them otherwise than decoding meets them (benchmarks/decoding/bench_verify.py times verifies on a ~100-token cache)
CALIBRATION_PREFIX = 128


class FastRuntime(StaticRuntime):
    def __init__(
        self,
        target: Target,
        max_len: int,
        batch: int = 1,
        layout: str = "auto",
        head: str = "auto",
        compiled: bool = True,
    ) -> None:
        """layout: one of `target_layouts(target.dtype, compiled)` for every call, or "auto": tn for one row,
        nt otherwise, until `calibrate()` measures the fastest per row count on the machine. head: the
        greedy head (`greedy_heads(target.dtype)`: plain, or screened where offered) for every call, or
        "auto": the screened one where offered until `calibrate()` times both. compiled=False: only the
        eager layouts are candidates (no inductor compile at start-up)."""
        self.compiled = compiled  # whether inductor layouts may be candidates (a proposer beside it follows)
        # whether its layouts were measured on this machine (now or by an earlier start): a draft beside it
        # measures its own only then (compose's EAGLE-3 proposer), so a start that skips one skips both
        self.calibrated = False
        self.candidates = target_layouts(target.dtype, compiled)
        if layout != "auto" and layout not in self.candidates:
            raise TargetError(
                f"GEMM layout {layout!r} is not available here",
                expected=" / ".join(("auto",) + self.candidates),
                found=layout,
                fix=_layout_fix(layout, target.dtype),
            )
        super().__init__(target, max_len, batch)
        self.policy: dict[int, str] = initial_policy(layout)
        # the graph's GEMM for two or more rows: the first offered of GRAPH_GEMMS (a panel GEMM, else oneDNN's)
        # until calibrate() times them (_calibrate_graph_gemm)
        self.graph_gemm = next(g for g in GRAPH_GEMMS if g in self.candidates + (PACKED,))
        self.graph_gemm_ms: dict[int, dict[str, float]] = {}  # {rows: {gemm: median ms}} of the last calibrate()
        self.graph = CompiledBody(self, self.graph_gemm) if GRAPH in self.candidates else None  # compiles on first use
        self.head_candidates = greedy_heads(target.dtype)
        if head != "auto" and head not in self.head_candidates:
            raise TargetError(
                f"greedy head {head!r} is not available here",
                expected=" / ".join(("auto",) + self.head_candidates),
                found=head,
                fix="the screened head needs an fp32 target, a torch build with oneDNN and a CPU with native bf16"
                if head == SCREENED
                else None,
            )
        # the greedy head's bf16 screen (screened_head.py), where it is offered and may be used
        self.screen_usable = SCREENED in self.head_candidates and head in ("auto", SCREENED)
        self.screen = self._new_screen() if self.screen_usable else None
        self.head_policy: dict[int, str] = {1: default_head(self.head_candidates) if head == "auto" else head}
        self.head_ms: dict[int, dict[str, float]] = {}  # {rows: {head: median ms}} of the last calibrate()
        self.calibration_ms: dict[int, dict[str, float]] = {}  # {rows: {layout: median ms}} of the last calibrate()
        self.fused_ms: dict[int, dict[str, float]] = {}  # {rows: {GRAPH or FUSED: median ms}} of compile_graphs()

    def _fuse(self, mods: list[torch.nn.Module]) -> Gemm:
        return Gemm.fused(mods, self.candidates, share=True)

    def _dense(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Gemm:
        return Gemm(weight, bias, self.candidates)

    def cache_slots(self, max_len: int) -> int:
        return cache_slots(max_len, GRAPH in self.candidates)

    def _layers(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
    ) -> Out:
        rows = h.shape[0] * h.shape[1]
        if (
            self.layout(rows) == GRAPH and start > 0
        ):  # a prefill runs eager: traced at start 0, inductor specialises on it
            return self.graph(h, cos, sin, start, mask, taps)
        eager = self.eager_layout(rows)
        return self.layers_forward(h, cos, sin, start, mask, taps, lambda lin, x: lin(x, eager), sdpa)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h, self.eager_layout(h.shape[0] * h.shape[1]))

    def layout(self, rows: int) -> str:
        """The layout measured (or assumed) fastest for the largest calibrated row count <= rows."""
        return pick(self.policy, rows)

    def eager_layout(self, rows: int) -> str:
        """The layout of a GEMM outside the layer stack (the head, a prefill): GRAPH's own GEMM for several
        rows stands in for it (the panel GEMM where offered, else oneDNN's packed one). A long prefill is
        compute-bound, so the panel GEMM, which reads each panel once per block of rows, costs there about
        what oneDNN's does."""
        lay = self.layout(rows)
        return self.graph_gemm if lay == GRAPH else lay

    def set_graph_gemm(self, gemm: str) -> None:
        """Make `gemm` (compiled_body.GRAPH_GEMMS, offered here) the graph's multi-row GEMM; a change gets a
        new CompiledBody (its graphs compile anew: the old ones do not guard on this choice)."""
        if gemm not in GRAPH_GEMMS or gemm not in self.candidates or self.graph is None:
            raise ValueError(
                f"the graph's GEMM {gemm!r} is not offered here (graph: {self.graph is not None}, "
                f"candidates {self.candidates})"
            )
        if gemm != self.graph_gemm:
            self.graph_gemm, self.graph = gemm, CompiledBody(self, gemm)

    def linears(self) -> list[Gemm]:
        """Every GEMM weight of the runtime: the layers' and the head."""
        return [lin for L in self.layers for lin in (L.qkv, L.o, L.gate_up, L.down)] + [self.head]

    def used_layouts(self) -> set[str]:
        """The GEMM layouts this runtime's calls reach under its policy: each calibrated row count's
        layout, GRAPH's own multi-row GEMM standing in for it (`eager_layout`: the graph's, the head's and a
        prefill's); the graph's one-row GEMV and the compiled GEMVs read W."""
        return {self.eager_layout(k) for k in self.policy}

    def settle_copies(self) -> int:
        """Hold exactly the weight copies the policy reads: build those of `used_layouts()` not built yet
        (a start that reused a cached calibration has built none) and free the rest (Gemm.keep); hold the
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
    def calibrate(
        self, ks: tuple[int, ...] = CALIBRATION_KS, reps: int = CALIBRATION_REPS, refine: int = REFINE_REPS
    ) -> dict[int, str]:
        """Time a whole verify forward per layout and row count on the machine it runs on; keep the fastest.
        Small-M GEMM speed depends on the weight's layout, and which one wins differs between machines.
        The medians are kept in `calibration_ms` {rows: {layout: ms}} (fastcpu/calibration.py stores them).
        refine: repetitions more for a close runner-up (gemm.time_layouts)."""
        prefix, ks = CALIBRATION_PREFIX, row_counts(ks, self.candidates)
        if prefix + max(ks) > self.max_len:
            raise ValueError(
                f"calibrate() writes {prefix}+{max(ks)} cache slots; this runtime has max_len "
                f"{self.max_len} (make_runtime allocates the room)"
            )

        dev = self.embed.device
        inputs = {
            k: (torch.zeros(1, k, dtype=torch.long, device=dev), torch.arange(prefix, prefix + k, device=dev)[None])
            for k in ks
        }  # built before timing: [1, k] ids and positions after the prefix

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
        do not outvote 4 rows'). Why measured: where oneDNN has AVX-512 kernels its few-row GEMMs can come
        near the memory's pace and beat a panel kernel, and an AVX-512 CPU offers two panel kernels, neither
        known to win in advance (`python -m benchmarks.decoding.bench_gemm` times them all)."""
        rows = tuple(k for k in ks if 2 <= k <= 16)
        gemms = tuple(g for g in GRAPH_GEMMS if g in self.candidates)
        if self.graph is None or not rows or len(gemms) < 2:
            return
        lins = self.linears()[:-1]  # the layer stack's (the graph's); not the head
        xs = {
            k: {n: torch.zeros(1, k, n, dtype=self.embed.dtype) for n in {lin.w.shape[1] for lin in lins}} for k in rows
        }  # [1, k, in] per input width

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
        GEMM is the graph's (then no fused graph is built). Only the sizes asked for compile, each once per
        machine and cache size (a minute or more cold; inductor's cache serves later starts). Returns the
        row counts run. The slots written (after CALIBRATION_PREFIX) are overwritten by any prefill."""
        rows = sorted(
            {
                min(k, 2)
                for k in self.policy
                if self.layout(k) in INDUCTOR_LAYOUTS and CALIBRATION_PREFIX + min(k, 2) <= self.max_len
            }
        )
        dev = self.embed.device

        def run(k: int) -> None:
            self.forward(
                torch.zeros(1, k, dtype=torch.long, device=dev),
                torch.arange(CALIBRATION_PREFIX, CALIBRATION_PREFIX + k, device=dev)[None],
                CALIBRATION_PREFIX,
            )

        for k in rows:
            run(k)
        # where the shared graph runs the panel GEMM, no fused graph is built: the panel GEMM already reads
        # each weight once per block of rows, which is what a fused graph buys over oneDNN's, so the fused
        # graphs lose to it, and each costs a minute or more of compile
        fused_sizes = () if self.graph_gemm in PANELS else sorted(set(verify_rows))
        for k in fused_sizes:
            if (
                self.graph is None
                or k not in FUSED_ROWS
                or self.layout(k) != GRAPH
                or CALIBRATION_PREFIX + k > self.max_len
            ):
                continue

            def variant(name: str, k: int) -> None:
                (self.graph.fused.add if name == FUSED else self.graph.fused.discard)(k)
                run(k)

            best, ms = time_layouts((GRAPH, FUSED), (k,), CALIBRATION_REPS, variant)
            variant(best[k], k)  # leaves the faster one chosen
            self.fused_ms[k] = ms[k]
            rows.append(k)
        return rows

    def _calibrate_head(
        self, inputs: dict[int, tuple[torch.Tensor, torch.Tensor]], prefix: int, reps: int, refine: int
    ) -> None:
        """Time the greedy head both ways (plain fp32 argmax, bf16 screen + recompute) on the final-norm
        states of the calibration's own forwards (real states: the screen's cost depends on how many
        tokens it keeps); keep the faster per row count. Both give the fp32 argmax: this is speed only."""
        heads = self.head_candidates if self.screen is not None else (PLAIN,)
        states = {k: self.hidden(*inp, prefix)[0] for k, inp in inputs.items()}  # [1, k, H] each

        def run(head: str, k: int) -> None:
            self.head_policy = {1: head}
            self.argmax(states[k])

        self.head_policy, self.head_ms = time_layouts(heads, tuple(inputs), reps, run, refine=refine)

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """Final-norm states [B, R, H] -> the fp32 head's argmax [B, R] (exact either way: screened_head.py)."""
        rows = h.shape[0] * h.shape[1]
        if self.screen is not None and pick(self.head_policy, rows) == SCREENED:
            return self.screen.argmax(h)
        return self._logits(h).argmax(-1)


def _layout_fix(layout: str, dtype: torch.dtype) -> str | None:
    """How to get an unavailable layout, where we know."""
    if layout == PACKED:
        return "dnnl needs a torch build with oneDNN (mkldnn) and, in bf16, a CPU with native bf16"
    if layout in PANELS:
        why = (
            "it is fp32 only"
            if dtype != torch.float32
            else panel_gemm.missing(PANELS[layout]) or "see the line on stderr"
        )
        return f"the {layout} GEMM is not offered here: {why}"
    return None


def cache_slots(max_len: int, graph: bool) -> int:
    """KV cache slots for a runtime of max_len tokens: at least one spare slot, never written, so that no
    forward's view of the cache spans all of it (a length a compiled graph would specialise on instead of
    keeping it dynamic). With GRAPH on offer, rounded up to a power of two (256 at least): the cache's
    size is part of the compiled graph (made dynamic, its tracing costs far more at every start), and
    make_runtime sizes the runtime per request, so every new size would compile anew."""
    return max(256, 1 << max_len.bit_length()) if graph else max_len + 1
