"""A few-row fp32 GEMM of our own (panel_gemm.cpp), for the verify forwards of speculative decoding.

Why: a verify forward multiplies a handful of rows (the draft's tokens) by every weight of the target,
and on a CPU it should cost about what one decode row costs: the weights stream from memory once either
way, and at 4-8 rows the FMAs still fit in the time the stream takes. The GEMMs torch reaches do not get
there for few rows. Measured on SmolLM2-135M's 120 body weights (425 MB, one pass each, fp32, 2 threads,
AMD EPYC with AVX2 only, sitting 23, interleaved in one process, medians of 11): oneDNN's prepacked GEMM
22.3 / 27.4 / 31.7 / 44.9 ms for 1 / 4 / 8 / 16 rows, this kernel 14.1 / 14.5 / 19.8 / 27.4 ms (a
plain sum over the same bytes: 13-15 ms). The kernel keeps a block of up to 6 rows x 16 output columns in
registers and reads each weight once per block (panel_gemm.cpp has the layout).

It is a candidate layout like the others (gemm.PANEL): the calibration times it against them per row
count and keeps it only where it wins; inside the compiled layer stack (compiled_body.GRAPH) it is the GEMM
for every row count (compiled_body.graph_linear).

Availability: fp32 weights, a CPU with AVX2 and FMA (read from /proc/cpuinfo at run time; the code is
compiled for exactly those, so a user cache carried to another machine never runs an instruction its CPU
lacks), a C++ compiler and ninja (torch.utils.cpp_extension builds it). Built once per machine, torch
version and source into the user cache (~12 s here), then loaded in well under a second. A machine
where any of this is missing does not get the layout and says why on stderr; the other layouts compute the
same products.

Numerics: fp32, each output summed in k order with FMAs: another summation order than oneDNN's (logits
within 1e-4 of the other layouts; tests/test_panel_gemm.py checks products against float64).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

from eaglewire.cache import cache_root
from eaglewire.hw import cpu_flags

NR = 8  # output columns per panel (panel_gemm.cpp's NR): the packing here and the kernel must agree
SOURCE = Path(__file__).with_name("panel_gemm.cpp")
CPU_FLAGS = ("avx2", "fma")  # what the kernel is compiled for (FLAGS); /proc/cpuinfo names
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")  # -fopenmp: at::parallel_for's threads (else one thread)


def _digest() -> str:
    """What the build depends on: the source, the flags, this torch and this Python."""
    key = "\n".join((SOURCE.read_text(), *FLAGS, torch.__version__, sys.version))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def build_dir() -> Path:
    """Where the kernel is built: the user cache, one directory per digest (a changed source, torch or
    Python builds anew beside the old one rather than loading it)."""
    return cache_root() / "kernels" / f"panel_gemm-{_digest()}"


def built() -> bool:
    """Whether this machine has already built the kernel for this source and torch (loading it is quick)."""
    return (build_dir() / "eaglewire_panel_gemm.so").is_file()


def missing() -> str | None:
    """Why the kernel cannot be built or run here, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    from eaglewire.decoding.compiled_gemv import compiler

    lacking = [f for f in CPU_FLAGS if f not in cpu_flags()]
    if lacking:
        return f"the CPU lacks {', '.join(lacking)} (/proc/cpuinfo)"
    if compiler() is None:
        return "no C++ compiler ($CXX or g++) on PATH"
    _ninja_on_path()
    if not is_ninja_available():
        return "ninja is not on PATH (pip install ninja)"
    return None


def _ninja_on_path() -> None:
    """Put the ninja that pip installed (a dependency) on PATH: a console script run without activating
    its venv would not find it, and torch's builder looks it up by name."""
    try:
        import ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join((ninja.BIN_DIR, path))


@functools.lru_cache(maxsize=1)
def _load() -> None:
    """Build (first time) and load the kernel, registering torch.ops.eaglewire_panel.linear."""
    from torch.utils.cpp_extension import load

    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    if not built():  # a start should say why it pauses (issue 14: starts say what they do)
        print(f"eaglewire: building the panel GEMM kernel into {out} (once per machine, torch and source: "
              "about 15 s)", file=sys.stderr, flush=True)
    load(name="eaglewire_panel_gemm", sources=[str(SOURCE)], build_directory=str(out), extra_cflags=list(FLAGS),
         extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    # the output's shape for tracing (compiled_body's graph calls the op; inductor asks for its shape)
    torch.library.register_fake("eaglewire_panel::linear")(_shape)


def _shape(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


@functools.lru_cache(maxsize=None)
def available(dtype: torch.dtype) -> bool:
    """Whether the PANEL layout is a candidate here: fp32, `missing()` finds nothing, and the kernel builds
    and computes a probe product right (rows 1-13 over a weight with a partial last panel and a bias).
    Probed once per process; says on stderr why not where it is not."""
    if dtype != torch.float32:
        return False
    why = missing()
    if why is None:
        try:
            _load()
        except (RuntimeError, OSError, ImportError) as err:
            why = f"it did not build ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    if why is None:
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
        x = torch.randn(13, 24, generator=g)
        panels = pack(w)
        err = max(float((linear(x[:m], panels, b, 40) - (x[:m].double() @ w.double().t() + b.double())).abs().max())
                  for m in range(1, 14))
        if not err <= 1e-4:  # also catches NaN
            why = f"its probe product was wrong (max abs error {err:.3g})"
    if why is not None:
        print(f"eaglewire: the panel GEMM layout is not offered here: {why}; the other layouts are used",
              file=sys.stderr)
    return why is None


def pack(w: torch.Tensor) -> torch.Tensor:
    """A weight [N, K] as the kernel's panels [ceil(N / NR), K, NR] (zero-padded past N)."""
    n, k = w.shape
    p = -(-n // NR)
    padded = torch.zeros(p * NR, k, dtype=w.dtype) if p * NR != n else None
    if padded is not None:
        padded[:n] = w
    return (w if padded is None else padded).reshape(p, NR, k).transpose(1, 2).contiguous()  # [P, K, NR]


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., K] @ W.T + bias -> [..., out_features], W given as `pack(W)`. `available` must be True."""
    return torch.ops.eaglewire_panel.linear(x, panels, bias, out_features)
