"""A one-row GEMM (a GEMV) as an inductor-generated reduction: torch.compile of `(w * x).sum(-1)`.

Why: a decode step multiplies one row by every weight, and is bound by how fast the weights stream from
memory. The BLAS kernels torch reaches stream them slowly for one row on some CPUs; inductor writes a plain
vectorized loop that reads each weight row once, and nothing is copied or re-laid out (`w` is the Gemm's
own [out, in] weight).

It is one candidate layout among the others (gemm.COMPILED): the calibration times it against them on
each machine and keeps it only where it wins, for one row only (for more rows the loop re-reads the weight
and oneDNN's packed GEMM is faster). `python -m benchmarks.decoding.bench_verify` measures the layouts.

Cost: the first use of each weight shape compiles a kernel (seconds a shape). The layout is offered only
where a probe kernel builds (`available`, once per process; it is also the process's first inductor call,
which a process using the layout would pay anyway). Inductor keeps the compiled kernels in its own on-disk
cache (TORCHINDUCTOR_CACHE_DIR, by default /tmp/torchinductor_<user>; torch fixes it on first use, so it is
not ours to move), and the next process loads them in a fraction of a second per shape. Only one-row shapes
are compiled: each once, by the calibration's first timing of this layout (untimed: gemm.time_layouts warms
every layout up first). Numerics: another fp32 summation order, like any other layout (logits within 1e-4
of oneDNN's on the targets tested).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import types
from typing import Callable

import torch

_KERNELS: dict[tuple[int, int, torch.dtype], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def _gemv(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w [O, I], x [R, I] -> [R, O]: a reduction over I per (row, output), fused (no [O, R, I] tensor)."""
    return (w[:, None, :] * x[None]).sum(-1).t()


def compiler() -> str | None:
    """The C++ compiler inductor uses on Linux: $CXX, else g++ (its search order); None if not on PATH."""
    name = os.environ.get("CXX") or "g++"
    return name if shutil.which(name) else None


@functools.lru_cache(maxsize=None)
def available(dtype: torch.dtype) -> bool:
    """Whether the compiled GEMV is a candidate here: fp32 weights, a C++ compiler, and a probe kernel that
    inductor compiles and that computes the right product (a compiler alone is not enough: inductor's
    kernels also need Python's and OpenMP's headers). Probed once per process; a machine whose probe fails
    simply does not get the layout (the other layouts give the same results), and says why on stderr."""
    if dtype != torch.float32 or compiler() is None:
        return False
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(8, 16, generator=g), torch.randn(1, 16, generator=g)
    try:
        with torch.no_grad():
            y = kernel((8, 16), dtype)(w, x)
    except (RuntimeError, OSError, ImportError) as err:  # dynamo wraps compiler failures in RuntimeErrors
        print(
            f"eaglewire: the compiled GEMV layout is not offered here: inductor could not build its probe "
            f"kernel ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
            file=sys.stderr,
        )
        return False
    err = float((y - x @ w.t()).abs().max())
    if not err <= 1e-5 * (1 + float((x @ w.t()).abs().max())):  # also catches NaN
        # seen with ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine whose inductor cache held the kernels
        # compiled without the cap (max error 4.3 on this probe; a fresh cache computed it right)
        print(
            f"eaglewire: the compiled GEMV layout is not offered here: inductor's probe kernel computed a "
            f"wrong product (max abs error {err:.3g}); the other layouts are used",
            file=sys.stderr,
        )
        return False
    return True


def kernel(shape: tuple[int, int], dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The compiled GEMV for weights of `shape` [O, I] in `dtype`, built on first use. Each shape gets its
    own code object (a renamed copy of `_gemv`'s), so each has its own compile cache entry: dynamo keeps
    at most a few graphs per code object before it falls back to eager, and a target plus its draft use
    about ten weight shapes."""
    key = (int(shape[0]), int(shape[1]), dtype)
    if key not in _KERNELS:
        code = _gemv.__code__.replace(co_name=f"gemv_{key[0]}x{key[1]}_{str(dtype).removeprefix('torch.')}")
        fn = types.FunctionType(code, _gemv.__globals__, code.co_name)
        _KERNELS[key] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _KERNELS[key]
