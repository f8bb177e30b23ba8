"""GEMM layouts for small row counts: one weight readable in every candidate layout, the fastest measured per
row count (`time_layouts`), and `pick` to look the winner up. Used by the target runtime (runtime.py), the
draft's decoding copy (draft.py) and the screened greedy head (screened_head.py).

Why: for small row counts the GEMM's speed depends on how the weight is laid out, and the fastest layout
differs by row count, dtype and machine, so it is measured, not assumed (`python -m benchmarks.decoding.bench_gemm`
times every layout offered on the machine it runs on).
"""

from __future__ import annotations

import time
from typing import Callable, Collection

import torch

from eaglewire.decoding.layers import Dense
from eaglewire.fastcpu import compiled_gemv, panel_gemm

LAYOUTS = ("nt", "tn", "wx")  # plain torch matmuls: always available
PACKED = "dnnl"  # oneDNN's prepacked weight, where this torch build exposes it (candidate_layouts)
PANEL = panel_gemm.AVX2.layout  # "panel": our few-row fp32 GEMM (panel_gemm.py) where it builds, AVX2 + FMA
PANEL_AVX512 = panel_gemm.AVX512.layout  # "panel-avx512": the same source built for AVX-512 (16 rows a block)
PANELS = {k.layout: k for k in panel_gemm.KERNELS}  # {layout: its panel_gemm.Kernel}
COMPILED = "inductor"  # one row only: compiled_gemv.py, where inductor has a C++ compiler (fp32)


def applies(layout: str, rows: int) -> bool:
    """Whether `layout` is a candidate for calls of `rows` rows (the compiled GEMV is for one row)."""
    return layout != COMPILED or rows == 1


AUTO_POLICY = {1: "tn", 2: "nt"}  # {rows: layout} until calibrate() measures the machine it runs on


def pick(policy: dict[int, str], rows: int) -> str:
    """The policy's layout for the largest row count <= rows."""
    layout = policy[max(k for k in policy if k <= rows)]
    if not applies(layout, rows):
        raise ValueError(
            f"layout policy {policy} gives {layout!r} to {rows} rows, which it does not apply to "
            "(gemm.fixed_policy / a calibration of every row count used gives a policy that works)"
        )
    return layout


def row_counts(ks: tuple[int, ...], candidates: tuple[str, ...]) -> tuple[int, ...]:
    """The row counts a calibration times: ks, plus 2 where a one-row layout could win at 1 and nothing
    would otherwise cover 2 rows (a policy {1: COMPILED, 4: ...} has no layout for 2-3 rows)."""
    if 1 in ks and 2 not in ks and any(not applies(lay, 2) for lay in candidates):
        return tuple(sorted(set(ks) | {2}))
    return tuple(ks)


def fixed_policy(layout: str) -> dict[int, str]:
    """The policy of a layout chosen by hand: that layout for every row count it applies to (the compiled
    GEMV: one row; AUTO_POLICY's layout for more)."""
    return {1: layout} if applies(layout, 2) else {1: layout, 2: AUTO_POLICY[2]}


def initial_policy(layout: str) -> dict[int, str]:
    """A runtime's policy before any calibration: AUTO_POLICY for "auto", else `fixed_policy(layout)`."""
    return dict(AUTO_POLICY) if layout == "auto" else fixed_policy(layout)


class CacheFlush:
    """Calling it writes a buffer twice the size of the CPU's largest cache (FALLBACK_CACHE_BYTES where the
    machine does not report one): what a draft's weights meet between two drafting rounds, after the
    target's forward has streamed hundreds of MB through the caches. Why: timed back to back, a small
    model's weights sit in L3 and the calibration picks layouts for a machine that decoding never sees
    (a cache-hot forward of a small draft can take about half the time of a flushed one)."""

    FALLBACK_CACHE_BYTES = 64 << 20

    def __init__(self) -> None:
        from eaglewire.hw import last_level_cache_bytes

        size = last_level_cache_bytes() or self.FALLBACK_CACHE_BYTES
        self.buf = torch.zeros(2 * size // 4)  # fp32 words

    def __call__(self) -> None:
        self.buf.add_(1.0)


# A calibration's runner-up within this fraction of the winner's median is timed again against it
# (REFINE_REPS more repetitions of the two, alternating): on a machine whose speed drifts by tens of percent
# between seconds, medians of a few repetitions can pick the slower of two close layouts.
REFINE_MARGIN, REFINE_REPS = 0.15, 8


def _sample(
    layouts: list[str],
    k: int,
    reps: int,
    run: Callable[[str, int], None],
    before: Callable[[], None] | None,
    samples: dict[str, list[float]],
) -> None:
    """Append `reps` timings of run(layout, k) per layout to samples, the layouts alternating."""
    for _ in range(reps):
        for lay in layouts:
            if before is not None:
                before()
            t0 = time.perf_counter()
            run(lay, k)
            samples[lay].append(time.perf_counter() - t0)


def _median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def time_layouts(
    candidates: tuple[str, ...],
    ks: tuple[int, ...],
    reps: int,
    run: Callable[[str, int], None],
    before: Callable[[], None] | None = None,
    refine: int = REFINE_REPS,
) -> tuple[dict[int, str], dict[int, dict[str, float]]]:
    """Time `run(layout, rows)` for every candidate layout and row count; return the fastest layout per row
    count and the medians {rows: {layout: ms}}. Layouts alternate within each repetition (machine noise
    drifts; back-to-back blocks biased it); a runner-up within REFINE_MARGIN is timed `refine` more
    times against the winner (0: never; a test counting calls). `before` (untimed) runs ahead of every timed call: a CacheFlush, say. A
    layout that does not `apply` to a row count is not timed there; each layout runs once untimed first
    (the compiled GEMV compiles on its first call)."""
    best: dict[int, str] = {}
    medians: dict[int, dict[str, float]] = {}
    for k in ks:
        layouts = [lay for lay in candidates if applies(lay, k)]
        samples: dict[str, list[float]] = {lay: [] for lay in layouts}
        for lay in layouts:
            run(lay, k)
        _sample(layouts, k, reps, run, before, samples)
        ranked = sorted(layouts, key=lambda lay: _median(samples[lay]))
        if (
            refine
            and len(ranked) > 1
            and _median(samples[ranked[1]]) <= (1 + REFINE_MARGIN) * _median(samples[ranked[0]])
        ):
            _sample(ranked[:2], k, refine, run, before, samples)
        timing = {lay: _median(v) for lay, v in samples.items()}
        best[k] = min(timing, key=timing.get)
        medians[k] = {lay: t * 1e3 for lay, t in timing.items()}
    return best, medians


def candidate_layouts(dtype: torch.dtype, compiled: bool = True) -> tuple[str, ...]:
    """The layouts a runtime in `dtype` can use here: LAYOUTS, plus "dnnl" where torch exposes oneDNN's
    prepacked linear (the ops inductor's CPU freezing uses) and the CPU runs `dtype` natively in it, plus
    each panel GEMM (PANELS) where panel_gemm offers it (under compiled=False only where this machine has
    built it already: loading it takes a fraction of a second, building it seconds), plus "inductor" (one row)
    where compiled_gemv is available and `compiled` allows it (False: no inductor at all, not even its
    probe: a start that must not wait for a compiler)."""
    from eaglewire.hw import native_bf16

    ops = torch.ops.mkldnn
    exposed = torch.backends.mkldnn.is_available() and all(
        hasattr(ops, op) for op in ("_reorder_linear_weight", "_linear_pointwise")
    )
    native = dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())
    panels = tuple(
        lay for lay, k in PANELS.items() if (compiled or panel_gemm.built(k)) and panel_gemm.available(k, dtype)
    )
    gemv = compiled and compiled_gemv.available(dtype)
    return LAYOUTS + ((PACKED,) if exposed and native else ()) + panels + ((COMPILED,) if gemv else ())


COPIES = ("tn", PACKED, *PANELS)  # the layouts that read a copy of the weight of their own (the rest read W)


class Gemm(Dense):
    """A weight [out, in] (+ bias) readable in every candidate layout, so each call can use the fastest GEMM:
    "nt" x @ W.t() (nn.Linear's), "tn" x @ Wt with Wt contiguous, "wx" (W @ x.T).T, "dnnl" oneDNN's
    prepacked weight (bias fused), a panel layout its kernel's panels (bias fused). Memory: a copy of the
    weight per layout in COPIES beside W, built when first asked for (`copy`, `prepare`) and freed by `keep`:
    while a calibration times every layout they all exist (up to four: Wt, oneDNN's, two panel kernels on an
    AVX-512 CPU); a runtime then keeps only those its policy reads (fastcpu.runtime.FastRuntime.settle_copies),
    which for a target is a large share of the process's resident memory."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, layouts: tuple[str, ...] = ()) -> None:
        """layouts: the candidate layouts (candidate_layouts): those in COPIES get a copy when first used
        ("tn" always: the plain layouts are always candidates). Nothing is copied here."""
        self.w = weight.detach().contiguous()  # [out, in]
        self.b = None if bias is None else bias.detach()
        self.offered = tuple(lay for lay in COPIES if lay == "tn" or lay in layouts)  # the copies this one makes
        # {layout: its copy}: "tn" Wt [in, out]; "dnnl" an opaque oneDNN tensor, blocked for its GEMM kernels;
        # a panel layout [P, in, nr]. An offered layout absent here is not built yet, or was freed (keep)
        self.copies: dict[str, torch.Tensor] = {}
        self.gemv: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # "inductor", once used

    def _copy(self, layout: str) -> torch.Tensor:
        if layout == "tn":
            return self.w.t().contiguous()
        if layout == PACKED:
            return torch.ops.mkldnn._reorder_linear_weight(self.w, None)
        return panel_gemm.pack(self.w, PANELS[layout].nr)

    def copy(self, layout: str) -> torch.Tensor:
        """The weight's copy for `layout` (in COPIES), built now if absent. Inside a graph being traced an
        absent copy raises instead: built there, it would be part of the graph, rebuilt every call (the
        graph builds its GEMM's copies first: compiled_body.CompiledBody.__call__)."""
        if layout not in self.copies:
            if layout not in self.offered:
                raise ValueError(
                    f"the {layout!r} copy of this weight was never offered (this Gemm offers "
                    f"{self.offered}: its runtime's candidate layouts)"
                )
            if torch.compiler.is_compiling():
                raise ValueError(
                    f"the {layout!r} copy of this weight is absent while a graph is traced: build it "
                    "before (Gemm.prepare)"
                )
            self.copies[layout] = self._copy(layout)
        return self.copies[layout]

    @property
    def absent(self) -> set[str]:
        """The offered copies not held now: not built yet, or freed by keep()."""
        return {lay for lay in self.offered if lay not in self.copies}

    def keep(self, layouts: set[str]) -> int:
        """Free the copies of the weight that no layout in `layouts` reads (W itself stays: the plain
        layouts, the compiled GEMVs and the graph's one-row GEMV read it); returns the bytes freed. A later
        call through a freed layout builds it again."""
        gone = [lay for lay in self.copies if lay not in layouts]
        freed = sum(_nbytes(self.copies[lay]) for lay in gone)
        for lay in gone:
            del self.copies[lay]
        return freed

    def prepare(self, layouts: Collection[str] = COPIES) -> None:
        """Build the absent copies among `layouts` that this Gemm offers (a calibration times them all)."""
        for lay in self.offered:
            if lay in layouts:
                self.copy(lay)

    def __call__(self, x: torch.Tensor, layout: str) -> torch.Tensor:  # x [..., in] -> [..., out]
        if layout == PACKED:
            return torch.ops.mkldnn._linear_pointwise(x, self.copy(PACKED), self.b, "none", [], "")
        if layout in PANELS:
            return panel_gemm.linear(PANELS[layout], x, self.copy(layout), self.b, self.w.shape[0])
        if layout == COMPILED:
            if x.numel() != x.shape[-1]:
                raise ValueError(
                    f"the {COMPILED} layout is a one-row GEMV; got {x.numel() // x.shape[-1]} rows "
                    "(gemm.pick never gives it more)"
                )
            if self.gemv is None:  # compiled (or loaded from inductor's cache) on first use: only shapes used
                self.gemv = compiled_gemv.kernel(tuple(self.w.shape), self.w.dtype)
            y = self.gemv(self.w, x.reshape(1, -1)).view(*x.shape[:-1], -1)
            return y if self.b is None else y + self.b
        if layout == "tn":
            y = x @ self.copy("tn")
        elif layout == "nt":
            y = x @ self.w.t()
        else:  # "wx": weight as the tall left operand
            y = (self.w @ x.reshape(-1, x.shape[-1]).t()).t().reshape(*x.shape[:-1], -1)
        return y if self.b is None else y + self.b


def hold_only(lins: list[Gemm], layouts: set[str]) -> int:
    """Make each Gemm hold exactly the copies `layouts` read: the others freed, absent ones built.
    Returns the bytes freed."""
    freed = 0
    for lin in lins:
        freed += lin.keep(layouts)
        lin.prepare(layouts)
    return freed


def _nbytes(t: torch.Tensor) -> int:
    """A weight copy's bytes (an opaque oneDNN tensor has no storage to ask: its logical size)."""
    return t.numel() * t.element_size()
