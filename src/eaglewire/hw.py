"""What the CPU eaglewire runs on can do, read at run time, never assumed (the same install may run on
an AVX2-only CPU and on one with AVX-512 and AVX512-BF16). fp32 is the default wherever bf16 is emulated.

Why it matters: on a CPU with AVX512-BF16 or AMX a bf16 GEMM is several times faster than the fp32 one;
without them PyTorch emulates bf16 and it is slower than fp32 (`python -m benchmarks.training.bench_train_dtype`
measures both, the CPU stated).

Where eaglewire runs is decided here too, once per process (`pick_device`): CUDA when a GPU is visible, else
the CPU, overridable by `--device` and a run config's `device` (both made from DEVICE_DEFAULT / DEVICE_HELP).
torch is imported inside the functions that need it: the command line imports this module for the
option's text, and its arithmetic commands stay torch-free.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of native bf16 dot products
# environment variables that cap the kernels' ISA below the CPU's flags (to measure AVX2 kernels on an
# AVX-512 machine): a figure measured under them must say so
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where that file does not exist."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int | None:
    """The largest CPU cache this machine reports (Linux sysfs, cpu0), in bytes; None where it is not
    reported."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


# oneDNN ISA names (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) whose kernels include native bf16 dot products;
# a cap to any other (AVX2, AVX512_CORE, ...) makes oneDNN refuse bf16 weights ("bf16 path needs ...")
ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
    "ALL",
    "DEFAULT",
)


def onednn_cap() -> str:
    """The ISA oneDNN is capped to (ONEDNN_MAX_CPU_ISA, or its older name DNNL_MAX_CPU_ISA), upper-case; '' = none."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()


def native_bf16() -> bool:
    """True when bf16 matrix products run natively on this CPU (AVX512-BF16 or AMX-BF16) and oneDNN is not
    capped below them (ONEDNN_MAX_CPU_ISA=AVX2, say, measuring AVX2 kernels on such a machine: oneDNN then
    cannot pack a bf16 weight). `EAGLEWIRE_NO_BF16=1` forces False (to measure fp32 on such a machine)."""
    if os.environ.get("EAGLEWIRE_NO_BF16") == "1":
        return False
    cap = onednn_cap()
    if cap and cap not in ONEDNN_BF16_ISAS:
        return False
    return any(f in cpu_flags() for f in BF16_FLAGS)


def amx_usable() -> bool:
    """True when the CPU has AMX tiles and oneDNN is not capped below an AMX ISA (ONEDNN_MAX_CPU_ISA=
    AVX512_CORE_BF16, say, measuring an AVX-512 CPU without AMX on one that has it)."""
    cap = onednn_cap()
    if cap and cap not in ("ALL", "DEFAULT") and "AMX" not in cap:
        return False
    return any(f.startswith("amx") for f in cpu_flags())


def describe_cpu() -> dict:
    """For benchmark files: which CPU an absolute number was measured on."""
    import torch

    isa = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {
        "model": cpu_model(),
        "isa": isa,
        "threads": torch.get_num_threads(),
        "native_bf16": native_bf16(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if k in os.environ},
    }


def _use_bf16(device: str, choice: str, names: tuple[str, str]) -> bool:
    """The one bf16 decision: choice is "auto" or one of names = (fp32 spelling, bf16 spelling). The bf16
    spelling is refused on a CPU without native bf16, where it would be slower and is never what the user
    wants; "auto" means bf16 on CUDA and on native-bf16 CPUs."""
    fp32, bf16 = names
    if choice not in ("auto", fp32, bf16):
        raise ValueError(f"dtype must be auto, {fp32} or {bf16}, not {choice!r}")
    if choice == fp32:
        return False
    native = device.startswith("cuda") or native_bf16()
    if choice == bf16 and not native:
        from eaglewire.errors import EaglewireError

        raise EaglewireError(
            f"{bf16} asked for on a CPU without native bf16",
            expected="a CPU with AVX512-BF16 or AMX (or a GPU)",
            found=f"{cpu_model()}: flags {sorted(cpu_flags() & set(BF16_FLAGS)) or 'none'}",
            fix=f"use --dtype auto or {fp32}",
        )
    return native


def autocast_dtype(device: str, dtype: str) -> torch.dtype | None:
    """The autocast dtype for training/capture: 'fp32' -> None; 'bf16' -> bf16 (refused on a CPU
    without native bf16); 'auto' -> bf16 on CUDA and on native-bf16 CPUs, else None."""
    import torch

    return torch.bfloat16 if _use_bf16(device, dtype, ("fp32", "bf16")) else None


RUNTIME_DTYPES = ("float32", "bfloat16", "auto")  # `--dtype` of generate / bench / serve


def runtime_dtype(choice: str, device: str = "cpu") -> torch.dtype:
    """The dtype the target and draft decode in: 'float32', 'bfloat16' (refused on a CPU without native
    bf16) or 'auto' (bfloat16 where native, else float32)."""
    import torch

    return torch.bfloat16 if _use_bf16(device, choice, ("float32", "bfloat16")) else torch.float32


DRAFT_DTYPES = ("auto", "target", "float32", "bfloat16")  # `--draft-dtype` of generate / bench / serve


def draft_dtype(choice: str, target_dtype: torch.dtype, device: str = "cpu") -> torch.dtype:
    """The dtype the draft decodes in: 'target' (the target's), 'float32', 'bfloat16' (refused on a CPU
    without native bf16) or 'auto': bfloat16 where bf16 is native, else the target's. The draft only
    proposes: the target verifies every token, so greedy output is the target's whatever the draft computes
    in, and a one-layer draft is memory-bound, so half the bytes per weight is most of its cost."""
    import torch

    if choice not in DRAFT_DTYPES:
        raise ValueError(f"draft dtype must be one of {', '.join(DRAFT_DTYPES)}, not {choice!r}")
    if choice == "target":
        return target_dtype
    if choice == "auto":
        return torch.bfloat16 if _use_bf16(device, "auto", ("float32", "bfloat16")) else target_dtype
    return runtime_dtype(choice, device)


def return_freed_memory() -> bool:
    """Ask the C allocator to give freed heap memory back to the OS (glibc's malloc_trim); False where the
    C library has no such call (musl, macOS: their freed memory stays with the process, reusable by it).
    Why: weights of a few MB each are allocated from the heap once glibc's mmap threshold has grown past
    them, and freeing them leaves the pages resident: a runtime that frees the weight copies its layouts
    do not read would otherwise keep their memory in its RSS."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)  # returns whether it released anything: either way the call did what it could
    return True


# --- where eaglewire runs ------------------------------------------------------------------------------------
DEVICE_DEFAULT = "auto"
DEVICE_HELP = (
    "auto | cpu | cuda | cuda:N: where the target, the draft and every stage run (capture, "
    "regeneration, training, the measured doctor, generate / bench / serve / eval). auto = cuda when a "
    "GPU is visible, else cpu. On a GPU the target runs in bfloat16 unless a dtype is named; a target "
    "too large for one GPU is spread over the visible GPUs (transformers' device_map)."
)


def check_device(choice: str) -> str:
    """The spelling of a device choice (auto, cpu, cuda, cuda:N), checked without looking at the machine."""
    import re

    if re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", str(choice)):
        return str(choice)
    from eaglewire.errors import EaglewireError

    raise EaglewireError(
        f"unknown device {choice!r}",
        expected="auto, cpu, cuda or cuda:N (N: a GPU index)",
        found=str(choice),
        fix="use --device auto (cuda when a GPU is visible, else cpu)",
    )


def pick_device(choice: str = DEVICE_DEFAULT) -> str:
    """The one device decision: 'auto' -> 'cuda' where torch sees a GPU, else 'cpu'; 'cuda' / 'cuda:N' asked
    for on a machine where torch sees none (or fewer) is refused, never quietly run on the CPU."""
    import torch

    choice = check_device(choice)
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(choice.partition(":")[2] or 0)
        if index >= count:
            from eaglewire.errors import EaglewireError

            build = f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU-only build'})"
            raise EaglewireError(
                f"device {choice!r} asked for, but torch sees {count} GPU(s)",
                expected=f"a visible CUDA GPU with index {index}",
                found=build,
                fix="install torch's CUDA build (docs: the GPU page), check CUDA_VISIBLE_DEVICES, or use --device cpu",
            )
    return choice


def default_dtype_name(device: str) -> str:
    """The dtype the target runs in when none is named: bfloat16 on a GPU (every GPU eaglewire targets computes
    it natively, at half the memory), float32 on the CPU (bf16 pays only where it is native: RUNTIME_DTYPES'
    'auto' says so where it is wanted)."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def describe_device(device: str) -> str:
    """One line for a command's first lines: the device and what it is."""
    import torch

    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or torch.cuda.current_device())
        props = torch.cuda.get_device_properties(index)
        count = torch.cuda.device_count()
        return (
            f"{device} ({props.name}, {props.total_memory / 2**30:.0f} GiB; {count} visible GPU"
            f"{'s' if count != 1 else ''}; target in {default_dtype_name(device)} unless a dtype is named)"
        )
    return f"{device} ({cpu_model()}, {torch.get_num_threads()} threads)"
