"""Markers for tests that need an optional extra: they skip, saying why, where it is not installed."""

import pytest

from eaglewire import fastcpu

needs_fastcpu = pytest.mark.skipif(fastcpu.available() is not None, reason=str(fastcpu.available()))
