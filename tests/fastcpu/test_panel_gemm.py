"""Our few-row GEMM (fastcpu/panel_gemm.py): its products against float64, its errors, where it is offered,
and its build cache; for each kernel (the AVX2 one; the AVX-512 one where the CPU has AVX-512; and the
AVX-512 kernel's code, its 16-wide panels and 16-row blocks, built for AVX2, so that its indexing is
tested on any AVX2 machine)."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire.fastcpu import panel_gemm
from eaglewire.fastcpu.gemm import PANEL, PANEL_AVX512, Gemm, candidate_layouts
from eaglewire.fastcpu.panel_gemm import AVX2, AVX512
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

# the AVX-512 kernel's width and block, compiled for AVX2 (the compiler splits each 16-wide vector in two)
WIDE_ON_AVX2 = dataclasses.replace(
    AVX512,
    layout="panel-avx512-code-on-avx2",
    isa="avx512code_avx2",
    cpu_flags=AVX2.cpu_flags,
    isa_flags=AVX2.isa_flags,
)
KERNELS = [AVX2, WIDE_ON_AVX2, AVX512]
IDS = [k.isa for k in KERNELS]


def need(kernel: panel_gemm.Kernel) -> None:
    if not panel_gemm.available(kernel, torch.float32):
        pytest.skip(
            f"the {kernel.isa} panel kernel is not offered on this machine: "
            f"{panel_gemm.missing(kernel) or 'see stderr'}"
        )


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    return (y if b is None else y + b.double()).float()


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 70),
    k=st.integers(1, 40),
    rows=st.integers(1, 40),
    bias=st.booleans(),
    batch=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_the_product_matches_float64_for_any_shape(kernel, n, k, rows, bias, batch, seed):
    """Every row count (one register block, several balanced ones), a last panel partly past N, with
    and without bias, and leading batch dims."""
    need(kernel)
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(n, k, generator=g), torch.randn(batch, rows, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    y = panel_gemm.linear(kernel, x, panel_gemm.pack(w, kernel.nr), b, n)
    assert y.shape == (batch, rows, n)
    torch.testing.assert_close(y, reference(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", [PANEL, PANEL_AVX512])
def test_a_non_contiguous_input_and_the_linear_layout(layout):
    kernel = {PANEL: AVX2, PANEL_AVX512: AVX512}[layout]
    need(kernel)
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    x = torch.randn(32, 5, generator=g).t()  # [5, 32], not contiguous
    lin = Gemm(w, b, (layout,))
    torch.testing.assert_close(lin(x, layout), reference(x, w, b), atol=1e-5, rtol=1e-5)
    assert lin.copies[layout].shape == (48 // kernel.nr, 32, kernel.nr)
    assert layout in candidate_layouts(torch.float32) and layout not in candidate_layouts(torch.bfloat16)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_bad_inputs_say_what_was_expected(kernel):
    need(kernel)
    w, x = torch.randn(4 * kernel.nr + 4, 8), torch.randn(2, 8)  # 5 panels
    n = w.shape[0]
    panels = panel_gemm.pack(w, kernel.nr)
    with pytest.raises(RuntimeError, match="expected fp32 x and panels"):
        panel_gemm.linear(kernel, x.double(), panels, None, n)
    with pytest.raises(RuntimeError, match="x has 9 features, the weight 8"):
        panel_gemm.linear(kernel, torch.randn(2, 9), panels, None, n)
    with pytest.raises(RuntimeError, match=f"5 panels cannot hold {6 * kernel.nr} outputs"):
        panel_gemm.linear(kernel, x, panels, None, 6 * kernel.nr)
    with pytest.raises(RuntimeError, match="expected contiguous panels"):
        panel_gemm.linear(kernel, x, w, None, n)
    with pytest.raises(RuntimeError, match=f"expected contiguous panels \\[P, K, {kernel.nr}\\]"):
        panel_gemm.linear(kernel, x, panel_gemm.pack(w, 24 - kernel.nr), None, n)  # the other kernel's width
    with pytest.raises(RuntimeError, match=f"bias of {n} elements"):
        panel_gemm.linear(kernel, x, panels, torch.randn(n - 1), n)


def test_the_kernels_load_side_by_side():
    """Each kernel registers its own op namespace: one process can time them against each other."""
    need(AVX2)
    need(WIDE_ON_AVX2)
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 24, generator=g), torch.randn(3, 24, generator=g)
    ys = [panel_gemm.linear(k, x, panel_gemm.pack(w, k.nr), None, 40) for k in (AVX2, WIDE_ON_AVX2)]
    assert AVX2.namespace != WIDE_ON_AVX2.namespace
    torch.testing.assert_close(ys[0], ys[1], atol=1e-5, rtol=1e-5)


@pytest.fixture
def probed_anew():
    """available() probes afresh inside the test (it is cached per process), and again after it."""
    panel_gemm.available.cache_clear()
    yield
    panel_gemm.available.cache_clear()


@pytest.mark.parametrize("kernel", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_not_offered_without_its_instruction_sets(monkeypatch, capsys, probed_anew, kernel):
    """Each kernel is compiled for its instruction sets: a CPU without them (read at run time) never gets
    the layout, and a line says why."""
    monkeypatch.setattr(panel_gemm, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert panel_gemm.missing(kernel) == f"the CPU lacks {', '.join(kernel.cpu_flags)} (/proc/cpuinfo)"
    assert not panel_gemm.available(kernel, torch.float32)
    said = f"the {kernel.layout} GEMM layout is not offered here: the CPU lacks" in capsys.readouterr().err
    assert said == (kernel is AVX2)  # silent for the AVX-512 kernel: the AVX2 one is the one such a CPU runs
    assert kernel.layout not in candidate_layouts(torch.float32)


def test_a_wrong_product_is_not_offered(monkeypatch, capsys, probed_anew):
    if panel_gemm.missing(AVX2) is not None:
        pytest.skip(f"the avx2 panel kernel is not offered here: {panel_gemm.missing(AVX2)}")
    monkeypatch.setattr(panel_gemm, "linear", lambda kernel, x, p, b, n: torch.zeros(*x.shape[:-1], n))
    assert not panel_gemm.available(AVX2, torch.float32)
    assert "probe product was wrong" in capsys.readouterr().err


def test_the_build_is_cached_per_kernel_source_and_torch(monkeypatch, tmp_path):
    """Built once into the user cache; another kernel, a changed source (or torch, or Python) gets a
    directory of its own, so a stale build is never loaded."""
    need(AVX2)
    assert panel_gemm.built(AVX2) and panel_gemm.build_dir(AVX2).parent.name == "kernels"
    here = panel_gemm.build_dir(AVX2)
    assert panel_gemm.build_dir(AVX512) != here and panel_gemm.build_dir(WIDE_ON_AVX2) != here
    src = tmp_path / "panel_gemm.cpp"
    src.write_text(panel_gemm.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(panel_gemm, "SOURCE", src)
    assert panel_gemm.build_dir(AVX2) != here and not (panel_gemm.build_dir(AVX2) / f"{AVX2.name}.so").exists()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    src.write_text(panel_gemm.SOURCE.read_text().removesuffix("\n// changed\n"))
    assert panel_gemm.build_dir(AVX2) != here


def test_a_fresh_cache_builds_once_and_says_so(tmp_path):
    """In a user cache that has no build, the first process builds the kernel and says so on stderr; the
    next one loads it silently. (Subprocesses: a process registers the op's namespace once.)"""
    import os
    import subprocess
    import sys

    if panel_gemm.missing(AVX2) is not None:
        pytest.skip(f"the avx2 panel kernel is not offered here: {panel_gemm.missing(AVX2)}")
    code = (
        "import torch; from eaglewire.fastcpu import panel_gemm; "
        "assert panel_gemm.available(panel_gemm.AVX2, torch.float32)"
    )
    env = {**os.environ, "EAGLEWIRE_CACHE": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:]
    assert "building the avx2 panel GEMM kernel" in runs[0].stderr
    assert "building" not in runs[1].stderr
    assert [p.name.startswith("panel_gemm-avx2-") for p in (tmp_path / "kernels").iterdir()] == [True]


def test_the_avx512_kernel_compiles_here_and_the_source_refuses_a_build_without_its_parameters(tmp_path):
    """The AVX-512 kernel compiles to object code on any machine (running it needs the CPU; its code shape
    runs above as WIDE_ON_AVX2); the width, block and namespace come only from Kernel.flags(), so a build
    without them stops at once."""
    import shutil
    import subprocess
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    if panel_gemm.compiler() is None:
        pytest.skip("no C++ compiler on PATH")
    base = [
        shutil.which(panel_gemm.compiler()),
        "-std=c++20",
        "-fPIC",  # torch 2.13's builder's standard
        *[f"-I{p}" for p in include_paths()],
        f"-I{sysconfig.get_paths()['include']}",
        str(panel_gemm.SOURCE),
    ]
    built = subprocess.run(
        [*base, *AVX512.flags(), "-c", "-o", str(tmp_path / "avx512.o")], capture_output=True, text=True, timeout=600
    )
    assert built.returncode == 0, built.stderr[-2000:]
    refused = subprocess.run([*base, "-fsyntax-only"], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "Kernel.flags() define EAGLEWIRE_PANEL_NR" in refused.stderr


def test_a_failed_build_keeps_the_compilers_output_and_a_stale_lock_is_cleared(monkeypatch, tmp_path, capsys):
    """torch's builder waits forever on a lock a killed build left; the message of a failed build names a
    file with the compiler's whole output rather than its first line."""
    import os

    from torch.utils import cpp_extension

    def failing(**_):
        raise RuntimeError("Error building extension 'eaglewire_panel_gemm_avx2':\nerror: 'vec' was not declared")

    monkeypatch.setattr(cpp_extension, "load", failing)
    lock = tmp_path / "lock"
    lock.write_text("")
    os.utime(lock, (0, 0))  # written in 1970: long stale
    with pytest.raises(RuntimeError, match="the compiler's output: .*build.log"):
        panel_gemm._build(AVX2, tmp_path)
    assert not lock.exists() and "stale build lock" in capsys.readouterr().err
    assert "'vec' was not declared" in (tmp_path / "build.log").read_text()
