"""Our few-row GEMM (decoding/panel_gemm.py): its products against float64, its errors, where it is offered,
and its build cache."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire.decoding import panel_gemm
from eaglewire.decoding.gemm import PANEL, Linear, candidate_layouts

NOT_HERE = "the panel GEMM is not offered on this machine (panel_gemm.missing() says why)"


def offered() -> bool:
    return panel_gemm.available(torch.float32)


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    return (y if b is None else y + b.double()).float()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), k=st.integers(1, 40), rows=st.integers(1, 20), bias=st.booleans(),
       batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_the_product_matches_float64_for_any_shape(n, k, rows, bias, batch, seed):
    """Every row count (one register block, several balanced ones), a last panel partly past N, with
    and without bias, and leading batch dims."""
    if not offered():
        pytest.skip(NOT_HERE)
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(n, k, generator=g), torch.randn(batch, rows, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    y = panel_gemm.linear(x, panel_gemm.pack(w), b, n)
    assert y.shape == (batch, rows, n)
    torch.testing.assert_close(y, reference(x, w, b), atol=1e-5, rtol=1e-5)


def test_a_non_contiguous_input_and_the_linear_layout():
    if not offered():
        pytest.skip(NOT_HERE)
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    x = torch.randn(32, 5, generator=g).t()  # [5, 32], not contiguous
    lin = Linear(w, b, panel=True)
    assert lin.panels.shape == (48 // panel_gemm.NR, 32, panel_gemm.NR)
    torch.testing.assert_close(lin(x, PANEL), reference(x, w, b), atol=1e-5, rtol=1e-5)
    assert PANEL in candidate_layouts(torch.float32) and PANEL not in candidate_layouts(torch.bfloat16)


def test_bad_inputs_say_what_was_expected():
    if not offered():
        pytest.skip(NOT_HERE)
    w, x = torch.randn(20, 8), torch.randn(2, 8)
    panels = panel_gemm.pack(w)
    with pytest.raises(RuntimeError, match="expected fp32 x and panels"):
        panel_gemm.linear(x.double(), panels, None, 20)
    with pytest.raises(RuntimeError, match="x has 9 features, the weight 8"):
        panel_gemm.linear(torch.randn(2, 9), panels, None, 20)
    with pytest.raises(RuntimeError, match="3 panels cannot hold 40 outputs"):
        panel_gemm.linear(x, panels, None, 40)
    with pytest.raises(RuntimeError, match="expected contiguous panels"):
        panel_gemm.linear(x, w, None, 20)
    with pytest.raises(RuntimeError, match="bias of 20 elements"):
        panel_gemm.linear(x, panels, torch.randn(19), 20)


@pytest.fixture
def probed_anew():
    """available() probes afresh inside the test (it is cached per process), and again after it."""
    panel_gemm.available.cache_clear()
    yield
    panel_gemm.available.cache_clear()


def test_not_offered_without_avx2_and_fma(monkeypatch, capsys, probed_anew):
    """The kernel is compiled for AVX2 + FMA: a CPU without them (read at run time) never gets the layout,
    and a line says why."""
    monkeypatch.setattr(panel_gemm, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert panel_gemm.missing() == "the CPU lacks avx2, fma (/proc/cpuinfo)"
    assert not panel_gemm.available(torch.float32)
    assert "panel GEMM layout is not offered here: the CPU lacks avx2" in capsys.readouterr().err


def test_a_wrong_product_is_not_offered(monkeypatch, capsys, probed_anew):
    if panel_gemm.missing() is not None:
        pytest.skip(NOT_HERE)
    monkeypatch.setattr(panel_gemm, "linear", lambda x, p, b, n: torch.zeros(*x.shape[:-1], n))
    assert not panel_gemm.available(torch.float32)
    assert "probe product was wrong" in capsys.readouterr().err


def test_the_build_is_cached_per_source_and_torch(monkeypatch, tmp_path):
    """Built once into the user cache; a changed source (or torch, or Python) gets a directory of its own,
    so a stale build is never loaded."""
    if not offered():
        pytest.skip(NOT_HERE)
    assert panel_gemm.built() and panel_gemm.build_dir().parent.name == "kernels"
    here = panel_gemm.build_dir()
    src = tmp_path / "panel_gemm.cpp"
    src.write_text(panel_gemm.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(panel_gemm, "SOURCE", src)
    assert panel_gemm.build_dir() != here and not (panel_gemm.build_dir() / f"{panel_gemm.NAME}.so").exists()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    src.write_text(panel_gemm.SOURCE.read_text().removesuffix("\n// changed\n"))
    assert panel_gemm.build_dir() != here


def test_a_fresh_cache_builds_once_and_says_so(tmp_path):
    """In a user cache that has no build, the first process builds the kernel and says so on stderr; the
    next one loads it silently. (Subprocesses: a process registers the op's namespace once.)"""
    import os
    import subprocess
    import sys

    if panel_gemm.missing() is not None:
        pytest.skip(NOT_HERE)
    code = "import torch; from eaglewire.decoding import panel_gemm; assert panel_gemm.available(torch.float32)"
    env = {**os.environ, "EAGLEWIRE_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:]
    assert "building the panel GEMM kernel" in runs[0].stderr
    assert "building" not in runs[1].stderr
    assert list((tmp_path / "kernels").iterdir())[0].name.startswith("panel_gemm-")


def test_a_failed_build_keeps_the_compilers_output_and_a_stale_lock_is_cleared(monkeypatch, tmp_path, capsys):
    """torch's builder waits forever on a lock a killed build left; the message of a failed build names a
    file with the compiler's whole output rather than its first line."""
    import os

    from torch.utils import cpp_extension

    def failing(**_):
        raise RuntimeError("Error building extension 'eaglewire_panel_gemm':\nerror: 'v8' was not declared")

    monkeypatch.setattr(cpp_extension, "load", failing)
    lock = tmp_path / "lock"
    lock.write_text("")
    os.utime(lock, (0, 0))  # written in 1970: long stale
    with pytest.raises(RuntimeError, match="the compiler's output: .*build.log"):
        panel_gemm._build(tmp_path)
    assert not lock.exists() and "stale build lock" in capsys.readouterr().err
    assert "'v8' was not declared" in (tmp_path / "build.log").read_text()
