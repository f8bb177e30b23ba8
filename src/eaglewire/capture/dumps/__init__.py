"""Hidden-state dumps written by other tools: read them, say what they hold, import them as feature shards.

import_dump(src, "specforge"|"speculators"|"auto", target, out, taps=..., taps_from=...) -> manifest
open_dump(src, fmt) -> a streaming reader (ids(), read(id) -> DumpSample)

importer.py     import_dump: a dump verified against the target, written as feature shards
report.py       inspect_dump: what a dump holds (shapes, coverage, and with a target which boundaries)
readers.py      open_dump / detect_format: the reader for a dump's format; our own feature directories
sample.py       DumpSample and the Dump protocol every reader returns, the checks readers share
specforge.py    SpecForge's offline data (torch.save samples, read weights_only)
speculators.py  speculators' offline data (an Arrow dataset plus hs_*.safetensors)
"""

from eaglewire.capture.dumps.importer import import_dump
from eaglewire.capture.dumps.readers import FORMATS, detect_format, open_dump
from eaglewire.capture.dumps.sample import POST_NORM, PRE_NORM, DumpSample

__all__ = ["FORMATS", "POST_NORM", "PRE_NORM", "DumpSample", "detect_format", "import_dump", "open_dump"]
