"""The type checker runs strictly on the contract, the norms, the tau formula, the drafter families, the records,
the taps, the target (its loader and protocols), decoding, export, the composition of decoding and the Python
front door (pyproject.toml [tool.mypy] names them), so a public signature cannot say one thing and do another.
Its cache lives in the user cache: a rerun takes seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from eaglewire.cache import cache_root

ROOT = Path(__file__).parents[1]


def test_mypy_strict_on_the_typed_modules():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache_root() / "mypy")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success" in out.stdout


def test_the_front_door_types_targets_by_their_protocol():
    """No public signature of the front door takes an untyped target."""
    import inspect

    import eaglewire as ew

    for name in ew.__all__:
        obj = getattr(ew, name)
        if inspect.isfunction(obj) and "target" in inspect.signature(obj).parameters:
            note = inspect.signature(obj).parameters["target"].annotation
            assert "Target" in str(note) and "Any" not in str(note), f"{name}(target: {note})"
