import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py helpers
torch.set_num_threads(2)


@pytest.fixture(scope="session", autouse=True)
def _calibrations_in_tmp(tmp_path_factory):
    """Runtimes the tests calibrate cache their layouts (and the markers of what they compiled) under a
    per-session temp dir, not the user's cache (which the embedded target's conversion, shared with the
    tests, keeps using). Session scope: set up before any module fixture that builds a runtime."""
    from eaglewire import fastcpu

    if fastcpu.available() is not None:  # no calibration without the extra
        yield
        return
    from eaglewire.fastcpu import calibration

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration, "cache_root", tmp_path_factory.getbasetemp)
        # so do the markers of compiled layouts (the kernels stay in inductor's cache: the tests share it)
        mp.setattr(calibration, "compiled_marker_dir", lambda: tmp_path_factory.getbasetemp() / "compiled-markers")
        yield
