"""A doctor finding: level (error / warn / info) · what · why it matters · how to fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warn" | "info"
    check: str
    what: str
    why: str
    fix: str
