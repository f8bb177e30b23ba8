"""Optional CPU acceleration of decoding: `pip install 'eaglewire[fastcpu]'`.

The speculative decoder (eaglewire.decoding) runs on torch alone; this layer makes its target runtime and
its draft faster on a CPU, without changing a token (every layout is tested for exact greedy agreement):

    runtime.py        FastRuntime: decoding.runtime.StaticRuntime with each GEMM in its calibrated layout
    gemm.py           Gemm: one weight readable in several layouts (oneDNN-packed, transposed, panels), timing
    panel_gemm.py     our few-row fp32 GEMM kernel (panel_gemm.cpp), built once per machine with ninja
    compiled_body.py  the whole layer stack as one inductor graph      compiled_gemv.py  the one-row GEMV
    screened_head.py  the greedy head through a bf16 screen            draft.py          FastDraft
    calibration.py    per-machine calibration, cached                  start.py          make_fast_runtime

`available()` says whether the extra is installed; eaglewire.compose.runtime picks this layer only then.
Nothing below eaglewire.compose imports it (tests/test_import_graph.py).
"""

from __future__ import annotations

import importlib.util
import os

COMPILE_MODES = ("always", "cached", "never")  # make_fast_runtime's `compile` (the CLI's --compile)
# make_fast_runtime's `calibrate` (generate's --calibrate): measure when this machine has no calibration yet,
# use only a calibration measured before (else the default layouts: a first start answers in seconds), or neither
CALIBRATE_MODES = ("always", "cached", "never")


def available() -> str | None:
    """None where the extra is installed and not switched off (EAGLEWIRE_FASTCPU=0, to compare the two
    runtimes on one install); else why this layer is not used."""
    if os.environ.get("EAGLEWIRE_FASTCPU", "1") == "0":
        return "switched off by EAGLEWIRE_FASTCPU=0"
    if importlib.util.find_spec("ninja") is None:
        return "the fastcpu extra is not installed (pip install 'eaglewire[fastcpu]': ninja builds its kernel)"
    return None
