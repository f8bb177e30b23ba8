"""The target's whole layer stack as one inductor graph: a candidate layout (GRAPH) of the fast runtime.

Why: a decode step of a small target is a few hundred tiny ops around its GEMMs, and on a CPU each op costs
microseconds of dispatch whatever its size, so norms, RoPE, cache writes, attention and residual adds take
a large share of a step. Traced once by torch.compile, the same layer code (`FastRuntime.layers_forward`,
no second copy of it) becomes a handful of fused C++ loops per layer.

The GEMMs inside the graph: for one row a GEMV written as `(w * x).sum(-1)` (compiled_gemv.py's form),
fused with the norm or activation that produces x; for more rows our panel GEMM (panel_gemm.py) where the
calibration times it faster (FastRuntime._calibrate_graph_gemm, one of GRAPH_GEMMS), else oneDNN's
prepacked weight through `eaglewire::packed_linear`, an opaque op registered here (inductor cannot lower
`mkldnn._linear_pointwise` on a weight that is a graph input, and its own several-row reduction is slower).
Where that GEMM is oneDNN's, a verify size may get a static graph of its own (FUSED, FUSED_ROWS: one GEMV
per row over the same weight, fused into one loop), kept only where FastRuntime.compile_graphs times it faster.

Shapes: the cache length and the row count above one are dynamic, so a runtime compiles two graphs (one
row, every larger row count) plus a static one per fused verify size; inductor caches the compiled code on
disk (TORCHINDUCTOR_CACHE_DIR), so only the first start for a cache size compiles. Options (GRAPH_OPTIONS,
`_keep_guard`): x realized once rather than recomputed per output row; guards on the call's arguments only;
a C++ wrapper, so that no Python frame is pushed per GEMM (see `_packed_linear`). The calibration times
GRAPH against the eager layouts like any other; `python -m benchmarks.decoding.bench_verify` measures them all.

Numerics: fp32 throughout, another summation order for the GEMVs and norms (within 1e-4 of the eager
layouts on the targets tested).
"""

from __future__ import annotations

import functools
import itertools
import types
from typing import Callable, Protocol

import torch

from eaglewire.fastcpu import compiled_gemv, panel_gemm
from eaglewire.fastcpu.gemm import COMPILED, PACKED, PANELS, Gemm, candidate_layouts
from eaglewire.ops import sdpa, unfused_attention

GRAPH = "graph"
FUSED = "graph-fused"  # GRAPH with a static graph of fused multi-row GEMVs for one verify size (fused_linear)
# the verify sizes that may get one: where it wins depends on the machine (fused_linear), so every asked size
# up to 8 is timed; beyond that the fused loop's per-row accumulators make it lose to oneDNN's GEMM
FUSED_ROWS = (2, 3, 4, 5, 6, 7, 8)
# inductor config for the graph (module docstring): realize each GEMV's input rather than recompute it per
# output row; a C++ wrapper (no Python frame per GEMM). Part of inductor's cache key, so a change compiles
# anew rather than loading stale code.
GRAPH_OPTIONS = {"realize_reads_threshold": 1, "cpp_wrapper": True}
INDUCTOR_LAYOUTS = (GRAPH, COMPILED)  # the target's layouts that inductor compiles (the rest: eager ops)


class LayerStack(Protocol):
    """What the graph traces: fastcpu.runtime.FastRuntime's layers and their forward (a protocol, so that this
    module needs nothing from runtime.py, which imports it)."""

    layers: list

    def prepare_copies(self, layouts: tuple[str, ...] | None = None) -> None: ...

    def layers_forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
        linear: Callable[[Gemm, torch.Tensor], torch.Tensor],
        attend: Callable,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


# An op inductor treats as opaque: oneDNN's prepacked linear on a weight the graph receives as an input.
# The Meta kernel gives the output's shape (the packed weight reports its logical [out, in] size).
_LIB = torch.library.Library("eaglewire", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor")


# The kernel is oneDNN's op itself (its C builtin, the trailing arguments bound by functools.partial, also
# C), not a Python function calling it. Why: a multi-row step calls this op 120 times, and on CPython 3.11
# every Python frame pushed at a stack depth where the interpreter's 16 KB frame-stack chunk runs out maps a
# new chunk and unmaps it on return: at those depths every GEMM costs an mmap + munmap pair, which slows the
# whole step and can make the calibration time the graph slower than eager dnnl. The graph's C++ wrapper
# (GRAPH_OPTIONS) calls the op through the dispatcher from C++ (torch 2.13's inductor; older ones called
# custom ops back through Python), so no Python frame is left per GEMM (tests/fastcpu/test_fastcpu_runtime.py checks it).
_packed_linear = functools.partial(
    torch.ops.mkldnn._linear_pointwise.default._op, attr="none", scalars=[], algorithm=""
)


def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])


# CPU for the activations, MkldnnCPU because the packed weight's dispatch key outranks it
for _key in ("CPU", "MkldnnCPU"):
    _LIB.impl("packed_linear", _packed_linear, _key)
_LIB.impl("packed_linear", _packed_linear_shape, "Meta")


def target_layouts(dtype: torch.dtype, compiled: bool = True) -> tuple[str, ...]:
    """The layouts a target runtime in `dtype` can use here: gemm.candidate_layouts, plus GRAPH where
    compiled_gemv's probe builds (fp32, a working C++ toolchain) and oneDNN's prepacked linear is offered.
    compiled=False: the eager layouts only (nothing inductor compiles, no probe)."""
    layouts = candidate_layouts(dtype, compiled)
    return layouts + ((GRAPH,) if compiled and PACKED in layouts and compiled_gemv.available(dtype) else ())


GRAPH_GEMMS = (*PANELS, PACKED)  # the graph's GEMM for two or more rows (FastRuntime.graph_gemm chooses)


def graph_linear(lin: Gemm, x: torch.Tensor, gemm: str = PACKED) -> torch.Tensor:  # x [B, T, in] -> [B, T, out]
    """A Gemm inside the graph: the fused GEMV for one row; for more, `gemm`: our panel GEMM
    (panel_gemm.py) or oneDNN's packed one."""
    if gemm in PANELS and x.shape[1] > 1:
        return panel_gemm.linear(PANELS[gemm], x, lin.copy(gemm), lin.b, lin.w.shape[0])
    if x.shape[1] == 1:
        y = (lin.w * x.reshape(x.shape[0], 1, -1)).sum(-1)  # [out, in] * [B, 1, in] -> [B, out]
        y = y[:, None]  # [B, 1, out]
        return y if lin.b is None else y + lin.b
    return torch.ops.eaglewire.packed_linear(x, lin.copy(PACKED), lin.b)


def fused_linear(lin: Gemm, x: torch.Tensor) -> torch.Tensor:  # x [B, T, in], B*T static -> [B, T, out]
    """A Gemm in a graph of a fixed row count (FUSED): one reduction per row over the same weight, which
    inductor fuses into one loop reading each weight row once for every row (B*T accumulators), the norm
    or activation before it realized once (GRAPH_OPTIONS). Whether it beats oneDNN's packed GEMM in the
    graph depends on the CPU and the row count (oneDNN's few-row kernels are slow on some CPUs; past a few
    rows the accumulators no longer fit), so FUSED_ROWS stops at 8 and a machine keeps a size's graph only
    where it times faster there (FastRuntime.compile_graphs; `python -m benchmarks.decoding.bench_verify` reports
    graph-fused beside graph)."""
    B, T, _ = x.shape
    rows = x.reshape(B * T, -1)  # [R, in]
    y = torch.stack([(lin.w * rows[m]).sum(-1) for m in range(B * T)]).view(B, T, -1)  # R x [out] -> [B, T, out]
    return y if lin.b is None else y + lin.b


def graph_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention inside the graph (q [B, Hq, T, D]): torch's fused kernel for one row, the unfused sum
    for more, which inductor fuses into a few loops (ops.unfused_attention has the figures)."""
    return sdpa(q, keys, values, mask) if q.shape[2] == 1 else unfused_attention(q, keys, values, mask)


_IDS = itertools.count()


def _keep_guard(entries: list) -> list[bool]:
    """Dynamo's guard filter for the graph: keep the guards on the call's tensors (h, cos, sin, mask: row
    count, cache length; the shape environment) and on globals; drop those on the runtime's attributes
    (`rt.*`: each weight, cache view and constant, ~600 checks a call). They cannot change under a graph:
    each runtime has its own code object and FastRuntime assigns them once, in __init__ (a weight's copies
    are built when first used and may be freed, FastRuntime.settle_copies: the graph fetches its tensors from
    rt on every call, and CompiledBody.__call__ builds its GEMM's copies again before a call where they were
    freed)."""
    attrs = _body.__code__.co_varnames[0] + "."  # "rt.": the runtime is _body's first argument
    return [not e.name.startswith(attrs) for e in entries]


def _body(
    rt: LayerStack, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, gemm: str = PACKED
) -> tuple[torch.Tensor, torch.Tensor]:
    """gemm: the multi-row GEMM, fixed per compiled copy (`_compile`'s default argument), not a guarded
    attribute of rt (`_keep_guard` drops those): a runtime that changes it compiles a new copy."""
    start = mask.shape[-1] - h.shape[1]  # the cache slots before these rows (symbolic: dynamic length)
    # every boundary's state, whatever taps the caller wants: taps are then no part of the graph (a
    # vanilla step, a proposer's verify and a warm-up share it); the write is (L+1) * H floats a row
    return rt.layers_forward(
        h,
        cos,
        sin,
        start,
        mask,
        tuple(range(len(rt.layers) + 1)),
        functools.partial(graph_linear, gemm=gemm),
        graph_attention,
    )


def _fused_body(
    rt: LayerStack, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """_body with fused_linear: compiled for one static row count each (FUSED)."""
    start = mask.shape[-1] - h.shape[1]
    return rt.layers_forward(h, cos, sin, start, mask, tuple(range(len(rt.layers) + 1)), fused_linear, graph_attention)


def _compile(body: Callable, name: str, defaults: tuple | None = None) -> tuple[types.CodeType, Callable]:
    """torch.compile of a renamed copy of `body` (its code object, where dynamo keeps its graphs), its
    default arguments `defaults` (else body's)."""
    code = body.__code__.replace(co_name=name)
    fn = types.FunctionType(
        code, body.__globals__, code.co_name, defaults if defaults is not None else body.__defaults__
    )
    return code, torch.compile(
        fn, fullgraph=True, dynamic=False, options={**GRAPH_OPTIONS, "guard_filter_fn": _keep_guard}
    )


class CompiledBody:
    """`FastRuntime.layers_forward` compiled for one runtime: call it with layers_forward's arguments."""

    def __init__(self, rt: LayerStack, gemm: str = PACKED) -> None:
        """gemm: the GEMM of two or more rows (GRAPH_GEMMS), fixed for this body's graphs."""
        if gemm not in GRAPH_GEMMS:
            raise ValueError(f"the graph's multi-row GEMM must be one of {GRAPH_GEMMS}, not {gemm!r}")
        self.rt, self.gemm = rt, gemm
        # a code object of its own per runtime: dynamo caches compiled graphs per code object and guards on
        # `rt`, so runtimes sharing one would evict each other's graphs (and hit its recompile limit)
        n = next(_IDS)
        self.code, self.fn = _compile(_body, f"target_body_{n}_{gemm}", (gemm,))  # tests count graphs off .code
        # static graphs of fused GEMVs, one per row count in `fused` (dynamic=False: each stays static)
        self.fused_code, self.fused_fn = _compile(_fused_body, f"target_fused_body_{n}")
        self.fused: set[int] = set()  # row counts run by fused_fn (FastRuntime.compile_graphs chooses)
        self.prepared = False  # whether the weight copies of `gemm` are built (the graph reads them)

    def __call__(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        taps: tuple[int, ...],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, _ = h.shape  # h [B, T, H]; cos, sin [B, 1, T, D]; mask additive [B or 1, 1, T, start+T] or None
        if not self.prepared:  # built before tracing (inside the trace a build would be part of the graph)
            self.rt.prepare_copies((self.gemm,))
            self.prepared = True
        if mask is None:  # one causal row: every cached slot visible. The graph always takes a mask, whose
            mask = h.new_zeros(B, 1, T, start + T)  # last dimension carries the (dynamic) cache length
        torch._dynamo.mark_dynamic(mask, 3)
        if B == 1 and T in self.fused:  # built for one sequence (compile_graphs): another batch shares fn
            h, every = self.fused_fn(self.rt, h, cos, sin, mask)  # [B, T, H], [B, T, (L+1) * H]
        else:
            if T > 1:  # one graph for every other row count above one (one row is the GEMV graph)
                for t in (h, cos, sin, mask):
                    torch._dynamo.mark_dynamic(t, t.dim() - 2)
            h, every = self.fn(self.rt, h, cos, sin, mask)
        if not taps:
            return h, None
        return h, every.view(B, T, -1, h.shape[-1])[:, :, list(taps)].reshape(B, T, -1)  # [B, T, n*H]
