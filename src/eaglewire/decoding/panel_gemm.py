"""A few-row fp32 GEMM of our own (panel_gemm.cpp), for the verify forwards of speculative decoding.

Why: a verify forward multiplies a handful of rows (the draft's tokens) by every weight of the target,
and on a CPU it should cost about what one decode row costs: the weights stream from memory once either
way, and at 4-8 rows the FMAs still fit in the time the stream takes. The GEMMs torch reaches do not get
there for few rows. Measured on SmolLM2-135M's 120 body weights as the runtime holds them (425 MB, one
pass each, fp32, 2 threads, AMD EPYC with AVX2 only, sitting 23, interleaved, medians of 11;
benchmarks/bench_gemm.py): this kernel 16.9 / 16.7 / 16.7 / 18.7 / 27.7 ms for 1 / 2 / 4 / 8 / 16 rows,
oneDNN's prepacked GEMM 21.9 / 23.2 / 26.4 / 31.6 / 42.3, a plain sum over the same bytes 12.7-13.3. The
kernel keeps a block of up to 8 rows x 8 output columns in registers and reads each weight once per block
(panel_gemm.cpp has the layout and why).

It is a candidate layout like the others (gemm.PANEL), timed by the calibration per row count; inside the
compiled layer stack (compiled_body.GRAPH) it is the GEMM for two or more rows where the calibration
times it faster than oneDNN's (LeanTarget._calibrate_graph_gemm; one row keeps the graph's fused GEMV),
and a GRAPH runtime's GEMMs outside the graph (the head, a prefill) then use it too
(LeanTarget.eager_layout).

Availability: fp32 weights, a CPU with AVX2 and FMA (read from /proc/cpuinfo at run time; the code is
compiled for exactly those, so a user cache carried to another machine never runs an instruction its CPU
lacks), a C++ compiler and ninja (torch.utils.cpp_extension builds it). Built once per machine, torch
install, compiler and source into the user cache (12-14 s on the AVX2 host of sitting 23; the start says so), after which a process
loads the built library directly (no compiler, no ninja). A machine where any of this is missing does not
get the layout and says why on stderr; the other layouts compute the same products.

Numerics: fp32, each output summed in k order with FMAs: another summation order than oneDNN's (SmolLM2's
logits within 6.8e-5 of the oneDNN graph's at 1-16 rows; tests/test_panel_gemm.py checks products against
float64).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from eaglewire.cache import cache_root
from eaglewire.hw import cpu_flags

NR = 8  # output columns per panel (panel_gemm.cpp's NR): the packing here and the kernel must agree
SOURCE = Path(__file__).with_name("panel_gemm.cpp")
NAME = "eaglewire_panel_gemm"  # the built library: NAME.so in build_dir()
CPU_FLAGS = ("avx2", "fma")  # what the kernel is compiled for (FLAGS); /proc/cpuinfo names
# -fopenmp: at::parallel_for's loop is compiled into the caller (else it runs on one thread); the
# contraction makes `acc += w * s` one FMA whatever the compiler's default
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=fast", "-fopenmp")
STALE_LOCK_S = 600  # a build lock older than this was left by a killed build (a build takes seconds)
_LOCK = threading.Lock()  # one build/load per process, whichever thread asks first
_loaded: list[Path] = []  # the library this process loaded (a process registers the op's namespace once)


def compiler() -> str | None:
    """The C++ compiler torch's extension builder uses on Linux ($CXX, else c++), resolved on PATH."""
    return shutil.which(os.environ.get("CXX") or "c++")


def _digest() -> str:
    """What the build depends on: the source, the flags, the compiler, this torch install and Python."""
    key = "\n".join((SOURCE.read_text(), *FLAGS, str(compiler()), torch.__version__, str(Path(torch.__file__).parent),
                     sys.version))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def build_dir() -> Path:
    """Where the kernel is built: the user cache, one directory per digest (a changed source, compiler,
    torch or Python builds anew beside the old one rather than loading it)."""
    return cache_root() / "kernels" / f"panel_gemm-{_digest()}"


def built() -> bool:
    """Whether the kernel is loaded in this process or built on this machine for this source and torch
    (loading it is then quick)."""
    return bool(_loaded) or (build_dir() / f"{NAME}.so").is_file()


def missing() -> str | None:
    """Why the kernel cannot be built or run here, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    lacking = [f for f in CPU_FLAGS if f not in cpu_flags()]
    if lacking:
        return f"the CPU lacks {', '.join(lacking)} (/proc/cpuinfo)"
    if built():
        return None  # loaded directly: no compiler or ninja needed
    if compiler() is None:
        return "no C++ compiler ($CXX, else c++) on PATH"
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


def _load() -> None:
    """Load the kernel (building it the first time), registering torch.ops.eaglewire_panel.linear."""
    with _LOCK:
        if _loaded:
            return
        out = build_dir()
        if built():
            torch.ops.load_library(str(out / f"{NAME}.so"))
        else:
            _build(out)
        # the output's shape for tracing (compiled_body's graph calls the op; inductor asks for its shape)
        torch.library.register_fake("eaglewire_panel::linear")(_shape)
        _loaded.append(out)


def _build(out: Path) -> None:
    """torch.utils.cpp_extension's build into `out`, saying so; a failure's whole log goes to build.log."""
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    lock = out / "lock"  # torch's builder waits on this file forever; a killed build leaves it behind
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        print(f"eaglewire: removing a stale build lock {lock} (a build killed part-way)", file=sys.stderr)
        lock.unlink(missing_ok=True)
    print(f"eaglewire: building the panel GEMM kernel into {out} (once per machine, torch and source: "
          "about 15 s)", file=sys.stderr, flush=True)
    try:
        load(name=NAME, sources=[str(SOURCE)], build_directory=str(out), extra_cflags=list(FLAGS),
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except (RuntimeError, OSError) as err:
        (out / "build.log").write_text(str(err))
        raise RuntimeError(f"the build failed (the compiler's output: {out / 'build.log'})") from err


def _shape(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


@functools.lru_cache(maxsize=None)
def available(dtype: torch.dtype) -> bool:
    """Whether the PANEL layout is a candidate here: fp32, `missing()` finds nothing, and the kernel loads
    (built the first time) and computes a probe product right (1-13 rows: one and two register blocks, over
    a weight whose last panel is partial, with a bias). Probed once per process; says on stderr why not
    where it is not."""
    if dtype != torch.float32:
        return False
    why = missing()
    if why is None:
        try:
            _load()
        except (RuntimeError, OSError, ImportError) as err:
            why = f"it did not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    if why is None:
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(37, 24, generator=g), torch.randn(37, generator=g)  # [N, K] (N: 4 panels + 5), [N]
        x = torch.randn(13, 24, generator=g)  # [M, K]
        panels = pack(w)  # [5, K, NR]
        err = max(float((linear(x[:m], panels, b, 37) - (x[:m].double() @ w.double().t() + b.double())).abs().max())
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
