"""Start an accelerated runtime: calibrate (or reuse the machine's cached calibration), hold only the
weight copies the chosen layouts read, and compile what the policy runs through inductor."""

from __future__ import annotations

import json
import time
from typing import Callable

from eaglewire.decoding.hf_runtime import HFRuntime
from eaglewire.decoding.runtime import SUPPORTED, Runtime
from eaglewire.fastcpu import CALIBRATE_MODES, COMPILE_MODES
from eaglewire.fastcpu.calibration import calibrate_cached, compiled_marker, reuse_cached
from eaglewire.fastcpu.compiled_body import FUSED, GRAPH, INDUCTOR_LAYOUTS
from eaglewire.fastcpu.runtime import CALIBRATION_KS, CALIBRATION_PREFIX, FastRuntime, cache_slots
from eaglewire.safeio import atomic_write_text
from eaglewire.target.loader import Target


def compiles_on_start(target: Target, max_len: int) -> bool:
    """Whether a calibrated start with compile "always" (serve, bench) builds compiled layouts now: no start on
    this machine has built them for this target and cache size yet (calibration.compiled_marker)."""
    if target.text_config.model_type not in SUPPORTED:
        return False
    return not compiled_marker(target, max(max_len, CALIBRATION_PREFIX + max(CALIBRATION_KS))).exists()


def make_fast_runtime(
    target: Target,
    max_len: int,
    *,
    calibrate: bool | str = False,
    log: Callable[[str], None] | None = None,
    compile: str = "always",
    verify_rows: tuple[int, ...] = (),
) -> Runtime:
    """The accelerated runtime where the architecture is supported, else the HF fallback. calibrate: set the
    fast runtime's GEMM layouts from the machine's cached calibration, measuring it (seconds) the first time
    (calibration.py); "cached": only a calibration measured before on this machine, else the default
    layouts (`eaglewire generate`: no minutes of timing before its first token); True is "always", False
    "never". `log` hears what the start does. compile (with calibrate): whether the
    inductor layouts (compiled_gemv.py, compiled_body.py's GRAPH) are candidates: "always" (serve, bench:
    a start on a cold machine compiles for one to a few minutes, and decode steps are then the fastest), "cached"
    (generate: only where a start on this machine already compiled them for this target and cache size,
    calibration.compiled_marker, written by a start that compiled something; else the eager layouts, so
    that a first start takes seconds), "never". verify_rows: the verify sizes (a TreeShape's
    num_draft_tokens) the caller's proposers will use; under "always" each in compiled_body.FUSED_ROWS gets
    its own fused graph where that times faster (FastRuntime.compile_graphs)."""
    mode = _calibrate_mode(calibrate, compile)
    calibrate = mode != "never"
    if target.text_config.model_type not in SUPPORTED:
        if log and calibrate:
            log(
                f"model_type {target.text_config.model_type!r}: HF transformers' forward (the fallback runtime), "
                "no GEMM layouts to calibrate"
            )
        return HFRuntime(target, max_len)
    # a calibration times verifies of up to max(CALIBRATION_KS) rows after a prefix: room for them even
    # where the requests need less (a short `generate`); the extra slots are a few KB per token
    n = max(max_len, CALIBRATION_PREFIX + max(CALIBRATION_KS)) if calibrate else max_len
    say = log or (lambda _msg: None)
    marker = compiled_marker(target, n) if calibrate and compile != "never" else None
    # an uncalibrated runtime never picks an inductor layout: leave inductor (and its probe) out of it
    compiled = marker is not None and (compile == "always" or marker.exists())
    if compile == "cached" and not compiled:
        say(
            f"no compiled layouts built on this machine yet for this target and a {cache_slots(n, True)}-slot "
            "cache: eager layouts this time (a start with --compile always builds them once, one to a few minutes)"
        )
    rt = FastRuntime(target, n, compiled=compiled)
    if calibrate and mode == "always":
        calibrate_cached(rt, log)
    elif calibrate and reuse_cached(rt, log) is None:
        calibrate = False  # the default layouts: nothing the calibration chose to compile
    rt.calibrated = calibrate
    # before compiling: the compile's own memory then comes on top of what decoding holds, not of 4x the weights
    _settle_copies(rt, say)
    if calibrate:
        # the fused verify graphs only where the caller accepts compiling (FastRuntime.compile_graphs: their cost):
        # the marker promises a "cached" start the shared graphs, not these
        if compiled and _compile(
            rt, say, verify_rows if compile == "always" else ()
        ):  # only a start that built something can promise it to the next
            atomic_write_text(marker, json.dumps({"compiled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    return rt


def _calibrate_mode(calibrate: bool | str, compile: str) -> str:
    """make_fast_runtime's `calibrate` as one of CALIBRATE_MODES (True: "always", False: "never"); an unknown
    calibrate or compile mode is refused."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    mode = ("always" if calibrate else "never") if isinstance(calibrate, bool) else calibrate
    if mode not in CALIBRATE_MODES:
        raise ValueError(f"calibrate must be a bool or one of {CALIBRATE_MODES}, got {calibrate!r}")
    return mode


def _settle_copies(rt: FastRuntime, say: Callable[[str], None]) -> None:
    """Keep the weight copies the policy reads, and no others (a calibration built them all; a cached one only
    the head's bf16 screen, where offered)."""
    freed = rt.settle_copies()
    if freed:
        say(
            f"freed {freed / 2**20:.0f} MB of weight copies that no chosen layout reads (layouts in use: "
            f"{', '.join(sorted(rt.used_layouts()))})"
        )


def _compile(rt, say: Callable[[str], None], verify_rows: tuple[int, ...]) -> list[int]:
    """Compile (or load from inductor's cache) the graphs and kernels the calibrated policy uses, now rather
    than inside the first request, and the fused graphs of `verify_rows` where they win (compile_graphs);
    returns the row counts warmed up ([] where the policy uses none)."""
    if not any(rt.layout(k) in INDUCTOR_LAYOUTS for k in rt.policy):
        return []
    say(
        "compiling the layouts the calibration chose (compiled_body.py, compiled_gemv.py: one to a "
        "few minutes the first time a machine sees this cache size, seconds once inductor has cached them)"
    )
    t0 = time.perf_counter()
    rows = rt.compile_graphs(verify_rows)
    shared = rows[: len(rows) - len(rt.fused_ms)]  # compile_graphs runs the fused verify sizes last
    fused = f", and the fused graphs of {', '.join(map(str, sorted(rt.fused_ms)))}-row verifies" if rt.fused_ms else ""
    say(
        f"compiled layouts for {' and '.join(f'{k}+' if k > 1 else '1' for k in shared)} rows{fused}, ready in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    for k, ms in rt.fused_ms.items():
        kept = "kept" if k in rt.graph.fused else "not kept"
        say(
            f"{k}-row verify: its fused graph {ms[FUSED]:.1f} ms against the shared graph's {ms[GRAPH]:.1f} ms ({kept})"
        )
    return rows
