"""A few-row fp32 GEMM of our own (panel_gemm.cpp), for the verify forwards of speculative decoding.

Why: a verify forward multiplies a handful of rows (the draft's tokens) by every weight of the target,
and on a CPU it should cost about what one decode row costs: the weights stream from memory once either
way, and at 4-8 rows the FMAs still fit in the time the stream takes. The GEMMs torch reaches do not get
there for few rows on some CPUs (oneDNN's few-row kernels fall well short of the memory's pace). The kernel
keeps a block of up to MR rows x NR output columns in registers and reads each weight once per block
(panel_gemm.cpp has the layout and why). `python -m benchmarks.decoding.bench_gemm` times it against oneDNN's GEMM
and a plain sum over the same bytes (the memory's pace).

It is a candidate layout like the others (gemm.PANEL), timed by the calibration per row count, and the
compiled layer stack's GEMM for two or more rows where it times faster (FastRuntime._calibrate_graph_gemm).

Kernels (KERNELS): one source, built per instruction set with its own panel width and block (Kernel):
the AVX2 one (layout "panel": 8-column panels, blocks of up to 8 rows in 8 of the 16 ymm registers) and
the AVX-512 one (layout "panel-avx512": 16-column panels, blocks of up to 16 rows in 16 of the 32 zmm
registers, so a 16-row verify streams each weight once). Each is a layout of its own, so the calibration
times them against each other and oneDNN's GEMM rather than assuming the wider one wins (some CPUs issue a
zmm FMA as two 256-bit halves). The AVX-512 kernel's code (its width and block) is tested built for AVX2
(tests/fastcpu/test_panel_gemm.py), and a machine offers it only where its probe product is right.

Availability: fp32 weights, a CPU with the kernel's instruction sets (read from /proc/cpuinfo at run time;
the code is compiled for exactly those), a C++ compiler and ninja. Built once per machine, kernel, torch
install, compiler and source into the user cache, then loaded directly (no compiler, no ninja). A machine
missing any of this does not get the layout and says why on stderr; the other layouts compute the same.

Numerics: fp32, each output summed in k order with FMAs: another summation order than oneDNN's, so results
differ from its in the last bits (tests/fastcpu/test_panel_gemm.py checks products against float64).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.cache import cache_root
from eaglewire.hw import cpu_flags

SOURCE = Path(__file__).with_name("panel_gemm.cpp")
STALE_LOCK_S = 600  # a build lock older than this was left by a killed build (a build takes seconds)
_LOCK = threading.Lock()  # one build/load per process, whichever thread asks first
_loaded: dict[str, Path] = {}  # {namespace: the library this process loaded} (a namespace registers once)


@dataclass(frozen=True)
class Kernel:
    """One build of panel_gemm.cpp: its instruction set, panel width and register block."""

    layout: str  # the gemm layout that runs it
    isa: str  # names the build, its library and its op namespace
    cpu_flags: tuple[str, ...]  # the /proc/cpuinfo flags it is compiled for: all needed to run it
    isa_flags: tuple[str, ...]  # the compiler's flags for those
    nr: int  # output columns per panel: one vector register (pack's panel width)
    mr: int  # rows per register block: mr accumulators + 1 weight + 1 broadcast must fit the registers

    @property
    def namespace(self) -> str:
        return f"eaglewire_panel_{self.isa}"

    @property
    def name(self) -> str:  # the built library: name.so in build_dir(kernel)
        return f"eaglewire_panel_gemm_{self.isa}"

    def flags(self) -> tuple[str, ...]:
        """The compiler's flags: -fopenmp, or at::parallel_for's loop (compiled into the caller) runs on
        one thread; the contraction makes `acc += w * s` one FMA whatever the compiler's default; the -D
        flags give the source its width, block and namespace."""
        return (
            "-O3",
            *self.isa_flags,
            "-ffp-contract=fast",
            "-fopenmp",
            f"-DEAGLEWIRE_PANEL_NR={self.nr}",
            f"-DEAGLEWIRE_PANEL_MR={self.mr}",
            f"-DEAGLEWIRE_PANEL_NS={self.namespace}",
        )


AVX2 = Kernel("panel", "avx2", ("avx2", "fma"), ("-mavx2", "-mfma"), nr=8, mr=8)
AVX512 = Kernel("panel-avx512", "avx512", ("avx512f", "fma"), ("-mavx512f", "-mfma"), nr=16, mr=16)
KERNELS = (AVX2, AVX512)


def compiler() -> str | None:
    """The C++ compiler torch's extension builder uses on Linux ($CXX, else c++), resolved on PATH."""
    return shutil.which(os.environ.get("CXX") or "c++")


def _digest(kernel: Kernel) -> str:
    """What a build depends on: the source, the flags, the compiler, this torch install and Python."""
    key = "\n".join(
        (
            SOURCE.read_text(),
            *kernel.flags(),
            str(compiler()),
            torch.__version__,
            str(Path(torch.__file__).parent),
            sys.version,
        )
    )
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def build_dir(kernel: Kernel) -> Path:
    """Where `kernel` is built: the user cache, one directory per kernel and digest (a changed source,
    compiler, torch or Python builds anew beside the old one rather than loading it)."""
    return cache_root() / "kernels" / f"panel_gemm-{kernel.isa}-{_digest(kernel)}"


def built(kernel: Kernel) -> bool:
    """Whether `kernel` is loaded in this process or built on this machine for this source and torch
    (loading it is then quick)."""
    return kernel.namespace in _loaded or (build_dir(kernel) / f"{kernel.name}.so").is_file()


def missing(kernel: Kernel) -> str | None:
    """Why `kernel` cannot be built or run here, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    lacking = [f for f in kernel.cpu_flags if f not in cpu_flags()]
    if lacking:
        return f"the CPU lacks {', '.join(lacking)} (/proc/cpuinfo)"
    if built(kernel):
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


def _load(kernel: Kernel) -> None:
    """Load `kernel` (building it the first time), registering torch.ops.<its namespace>.linear."""
    with _LOCK:
        if kernel.namespace in _loaded:
            return
        out = build_dir(kernel)
        if built(kernel):
            torch.ops.load_library(str(out / f"{kernel.name}.so"))
        else:
            _build(kernel, out)
        # the output's shape for tracing (compiled_body's graph calls the op; inductor asks for its shape)
        torch.library.register_fake(f"{kernel.namespace}::linear")(_shape)
        _loaded[kernel.namespace] = out


def _build(kernel: Kernel, out: Path) -> None:
    """torch.utils.cpp_extension's build into `out`, saying so; a failure's whole log goes to build.log."""
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    lock = out / "lock"  # torch's builder waits on this file forever; a killed build leaves it behind
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        print(f"eaglewire: removing a stale build lock {lock} (a build killed part-way)", file=sys.stderr)
        lock.unlink(missing_ok=True)
    print(
        f"eaglewire: building the {kernel.isa} panel GEMM kernel into {out} (once per machine, torch and "
        "source: seconds)",
        file=sys.stderr,
        flush=True,
    )
    try:
        load(
            name=kernel.name,
            sources=[str(SOURCE)],
            build_directory=str(out),
            extra_cflags=list(kernel.flags()),
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError) as err:
        (out / "build.log").write_text(str(err))
        raise RuntimeError(f"the build failed (the compiler's output: {out / 'build.log'})") from err


def _shape(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


@functools.lru_cache(maxsize=None)
def available(kernel: Kernel, dtype: torch.dtype) -> bool:
    """Whether `kernel`'s layout is a candidate here: fp32, `missing()` finds nothing, and the kernel loads
    (built the first time) and computes a probe product right (1 to 2 * mr + 5 rows: one and several
    register blocks, over a weight whose last panel is partial, with a bias). Probed once per process;
    says on stderr why not where it is not."""
    if dtype != torch.float32:
        return False
    why = missing(kernel)
    if why is None:
        try:
            _load(kernel)
        except (RuntimeError, OSError, ImportError) as err:
            why = f"it did not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    if why is None:
        g = torch.Generator().manual_seed(0)
        n, rows = 4 * kernel.nr + 5, 2 * kernel.mr + 5  # outputs: 4 panels + a partial one
        w, b = torch.randn(n, 24, generator=g), torch.randn(n, generator=g)  # [N, K], [N]
        x = torch.randn(rows, 24, generator=g)  # [M, K]
        panels = pack(w, kernel.nr)  # [5, K, nr]
        err = max(
            float((linear(kernel, x[:m], panels, b, n) - (x[:m].double() @ w.double().t() + b.double())).abs().max())
            for m in range(1, rows + 1)
        )
        if not err <= 1e-4:  # also catches NaN
            why = f"its probe product was wrong (max abs error {err:.3g})"
    # said, except for a wider kernel on a CPU without its instruction set (an AVX2-only CPU, every start:
    # the AVX2 kernel is the one for it)
    if why is not None and not (kernel is not KERNELS[0] and why.startswith("the CPU lacks")):
        print(
            f"eaglewire: the {kernel.layout} GEMM layout is not offered here: {why}; the other layouts are used",
            file=sys.stderr,
        )
    return why is None


def pack(w: torch.Tensor, nr: int) -> torch.Tensor:
    """A weight [N, K] as a kernel's panels [ceil(N / nr), K, nr] (zero-padded past N)."""
    n, k = w.shape
    p = -(-n // nr)
    padded = torch.zeros(p * nr, k, dtype=w.dtype) if p * nr != n else None
    if padded is not None:
        padded[:n] = w
    return (w if padded is None else padded).reshape(p, nr, k).transpose(1, 2).contiguous()  # [P, K, nr]


def linear(
    kernel: Kernel, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x [..., K] @ W.T + bias -> [..., out_features], W given as `pack(W, kernel.nr)`. `available` must
    be True for `kernel`."""
    return getattr(torch.ops, kernel.namespace).linear(x, panels, bias, out_features)
