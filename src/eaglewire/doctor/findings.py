"""A doctor finding: level (error / warn / info) · what · why it matters · how to fix; a report of them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warn" | "info"
    check: str
    what: str
    why: str
    fix: str


@dataclass
class Report:
    """The doctor's verdict on one draft directory: its findings, most severe first; `errors` counts the errors."""

    directory: str
    engine: str
    findings: list[Finding]
    measurement: dict[str, Any] | None = None  # the empirical wiring check's figures (doctor/trained_taps.py)

    @property
    def errors(self) -> int:
        return sum(f.level == "error" for f in self.findings)

    def to_json(self) -> str:
        return json.dumps(
            {
                "directory": self.directory,
                "engine": self.engine,
                "errors": self.errors,
                "findings": [asdict(f) for f in self.findings],
                "measurement": self.measurement,
            },
            indent=2,
        )


def by_level(findings: list[Finding]) -> list[Finding]:
    order = {"error": 0, "warn": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.level])
