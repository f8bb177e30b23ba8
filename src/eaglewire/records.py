"""Records: JSON text hashed canonically, and a JSON object checked field for field against a dataclass (the
contract's parts and every record read through it)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from eaglewire.errors import ContractMismatch
from eaglewire.safeio import check_dataclass_fields


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _exact_keys(what: str, data: dict[str, Any], cls: type) -> None:

    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    unknown, missing = sorted(data.keys() - names), sorted(required - data.keys())
    if unknown or missing:
        raise ContractMismatch(
            f"{what} has the wrong fields",
            expected=f"fields {sorted(names)}",
            found=f"unknown {unknown}, missing {missing}",
            fix="the artifact was written by another tool or version; re-create it",
        )


def checked_record(what: str, data: Any, cls: type) -> dict[str, Any]:
    """A copy of `data` once it is a JSON object with exactly `cls`'s fields, each of its declared type."""
    if not isinstance(data, dict):
        raise ContractMismatch(f"{what} must be a JSON object", expected="{...}", found=type(data).__name__)
    _exact_keys(what, data, cls)
    check_dataclass_fields(data, cls, where=what, error=ContractMismatch)
    return dict(data)


def build_exact_record(what: str, data: Any, cls: type) -> Any:
    return cls(**checked_record(what, data, cls))


def flatten_dict(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
