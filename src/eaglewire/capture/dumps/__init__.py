"""Hidden-state dumps written by other tools: read them, say what they hold, import them as feature shards.

import_dump(src, "specforge"|"speculators"|"auto", target, out, taps=..., taps_from=...) -> manifest
open_dump(src, fmt) -> a streaming reader (ids(), read(id) -> DumpSample)
"""

from eaglewire.capture.dumps.importer import import_dump
from eaglewire.capture.dumps.readers import FORMATS, POST_NORM, PRE_NORM, DumpSample, detect_format, open_dump

__all__ = ["FORMATS", "POST_NORM", "PRE_NORM", "DumpSample", "detect_format", "import_dump", "open_dump"]
