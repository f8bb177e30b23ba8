"""Hidden-state dumps written by other tools: read them, say what they hold, import them as feature shards.

    import_dump(src, "specforge"|"speculators"|"auto", target, out, taps=..., taps_from=...) -> manifest
    inspect_dump(src, "auto", target=None, declared_taps=None, taps_from=None) -> DumpReport
    open_dump(src, fmt) -> a streaming reader (ids(), read(id) -> DumpSample)
"""

from eaglewire.data.dumps.importer import import_dump
from eaglewire.data.dumps.readers import FORMATS, POST_NORM, PRE_NORM, DumpSample, detect_format, open_dump
from eaglewire.data.dumps.report import DumpReport, inspect_dump

__all__ = ["FORMATS", "POST_NORM", "PRE_NORM", "DumpReport", "DumpSample", "detect_format", "import_dump",
           "inspect_dump", "open_dump"]
