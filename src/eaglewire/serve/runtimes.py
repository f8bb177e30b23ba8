"""Which runtime and drafter a surface (bench, generate, serve) decodes with.

With the fastcpu extra installed: the accelerated runtime (calibrated GEMM layouts, compiled graphs) and
the draft's accelerated copy. Without it: the plain static-cache runtime and the draft's own modules, the
same tokens, slower. Either way the choice is said once per process, so a user knows what ran.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from eaglewire import fastcpu
from eaglewire.contract import WiringContract
from eaglewire.decoding.propose import Proposer, proposer_family
from eaglewire.decoding.runtime import SUPPORTED, Runtime, plain_runtime
from eaglewire.decoding.tree import TreeShape
from eaglewire.target.loader import Target

COMPILE_MODES = fastcpu.COMPILE_MODES
_said: set[str] = set()  # the runtime lines said in this process


def _say_once(line: str, log: Callable[[str], None] | None) -> None:
    if line not in _said:
        _said.add(line)
        (log or logging.getLogger("eaglewire").info)(line)


def make_runtime(target: Target, max_len: int, *, calibrate: bool = False, log: Callable[[str], None] | None = None,
                 compile: str = "always", verify_rows: tuple[int, ...] = ()) -> Runtime:
    """The fastest runtime installed here for `target`. calibrate / compile / verify_rows go to
    fastcpu.start.make_fast_runtime (what a start measures and compiles); without the extra they do nothing."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    missing = fastcpu.available()
    arch = target.text_config.model_type
    if arch not in SUPPORTED:
        _say_once(f"runtime: transformers' own forward (model_type {arch!r} has no static-cache runtime)", log)
        return plain_runtime(target, max_len)
    if missing:
        _say_once(f"runtime: plain static-cache runtime ({missing}; the same tokens, slower)", log)
        return plain_runtime(target, max_len)
    from eaglewire.fastcpu.start import make_fast_runtime  # only where the extra is installed

    _say_once("runtime: fastcpu (GEMM layouts calibrated on this machine, compiled graphs)", log)
    return make_fast_runtime(target, max_len, calibrate=calibrate, log=log, compile=compile, verify_rows=verify_rows)


def make_proposer(draft: Any, contract: WiringContract, shape: TreeShape, max_len: int,
                  runtime: Runtime) -> Proposer:
    """The proposer of the draft's family (decoding.propose.PROPOSERS) beside `runtime`: the draft's
    accelerated copy where the runtime is accelerated and the family has one (compiled layouts only where the
    runtime's are), else the draft's own modules."""
    family = proposer_family(contract)
    drafter = None
    if family.fast_drafter and fastcpu.available() is None:
        from eaglewire.fastcpu.draft import FastDraft
        from eaglewire.fastcpu.runtime import FastRuntime

        if isinstance(runtime, FastRuntime):
            drafter = FastDraft(draft, "auto", runtime.compiled)
    return family.make(draft, contract, shape, max_len, drafter)
