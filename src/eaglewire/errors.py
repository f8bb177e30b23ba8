"""One error type with a fixed shape: what went wrong, what was expected, what was found, how to fix it.

Every loader and checker in eaglewire raises these instead of falling back silently; the CLI prints them
without a stack trace (exit code 2), because the message already names the cause.
"""

from __future__ import annotations


class EaglewireError(Exception):
    """A user-facing error. `str(err)` is the full message the CLI prints."""

    def __init__(
        self, what: str, *, expected: str | None = None, found: str | None = None, fix: str | None = None
    ) -> None:
        self.what = what
        self.expected = expected
        self.found = found
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.what]
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found:    {self.found}")
        if self.fix is not None:
            lines.append(f"  fix:      {self.fix}")
        return "\n".join(lines)


class TranslationError(EaglewireError):
    """A tap list that an engine's layer-id convention cannot express."""


class ContractMismatch(EaglewireError):
    """Two wiring contracts (or a contract and a target) disagree on a field."""


class TapWidthError(EaglewireError):
    """Hidden states of the wrong width were fed to a draft (the silent `fc`-skip failure)."""


class CheckpointError(EaglewireError):
    """A checkpoint whose keys, shapes, dtypes, vocab map or config do not match what is required."""


class TargetError(EaglewireError):
    """A target that cannot be found, loaded, or whose decoder layers cannot be located."""
