"""Atomic file writes (a killed process leaves either the old file or the new one, never half of one), and
the guarded readers of untrusted files (JSON and safetensors) every loader shares. Digests of files a command
reuses are digests.py's."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if (
    TYPE_CHECKING
):  # torch loads where tensors are touched: JSON-only callers (the contract, arithmetic commands) skip it
    import torch


def _tmp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def _temp_beside(path: Path) -> Iterator[Path]:
    """A temp name beside `path` for the block to write, renamed over `path` when the block ends; on any
    failure (a full disk, a read-only folder) the temp file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with _temp_beside(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy a file (and a `.meta.json` sidecar next to it, if any) so a kill never leaves half a copy. The
    sidecar goes first: a data file without its settings would be refused as another tool's file."""
    import shutil

    for a, b in ((Path(f"{src}.meta.json"), Path(f"{dst}.meta.json")), (Path(src), Path(dst))):
        if a.is_file():
            with _temp_beside(b) as tmp:
                shutil.copyfile(a, tmp)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """safetensors.save_file to a temp name, then rename. Tensors are made contiguous (required). The writer's
    I/O failures (Rust errors that name an OS error code) are raised as the OSError they are."""
    import re

    from safetensors.torch import save_file

    with _temp_beside(Path(path)) as tmp:
        try:
            save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        except Exception as err:  # SafetensorError("... I/O error: No space left on device (os error 28)")
            code = re.search(r"\(os error (\d+)\)|\bcode: (\d+)", str(err))
            if code is None or isinstance(err, OSError):
                raise
            n = int(code.group(1) or code.group(2))
            raise OSError(n, os.strerror(n), str(path)) from None


# ------------------------------------------------------------------------------------------------------
# Reading untrusted files: every failure becomes an EaglewireError (what / expected / found / fix) naming
# the file. Readers call these instead of json.loads / safe_open directly, so no damaged file can end in a
# raw traceback, and nothing here ever unpickles.
# ------------------------------------------------------------------------------------------------------

_PICKLE_PROTO = b"\x80"  # pickle protocol >= 2 opcode: what torch.save/pickle.dump write first
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip container (a pickle inside)
_MAX_JSON_BYTES = 64 << 20  # configs, manifests, contracts: far below this; a bigger one is not ours
_MAX_HEADER_BYTES = 100_000_000  # a safetensors JSON header: the format's own cap (its reader refuses more)


def damaged(
    path: Path | str, what: str, expected: str, found: str, fix: str | None = None, error: type[Exception] | None = None
) -> Exception:
    """The error for a file that cannot be read as `what`."""
    from eaglewire.errors import EaglewireError

    cls = error or EaglewireError
    return cls(
        f"cannot read {path} as {what}",
        expected=expected,
        found=found,
        fix=fix or f"re-create {Path(path).name} with the tool that wrote it, or restore it from a copy",
    )


def _sniff(head: bytes) -> str:
    if head.startswith(_PICKLE_PROTO):
        return "a pickle (torch.save / pickle.dump); eaglewire never unpickles"
    if head.startswith(_ZIP_MAGIC):
        return "a zip archive (torch.save's format, a pickle inside); eaglewire never unpickles"
    if head.startswith(b"\x1f\x8b"):
        return "gzip-compressed data"
    return f"{len(head)} leading byte(s) {head[:16]!r}"


def read_json_file(path: Path | str, *, what: str, error: type[Exception] | None = None) -> Any:
    """Parse a JSON file: missing, unreadable, too large, non-UTF-8, invalid or absurdly nested JSON all
    become one error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise damaged(
            path,
            what,
            f"a JSON file {path.name}",
            "no such file" if not path.exists() else "not a regular file",
            f"point at the directory holding {path.name}",
            error,
        )
    try:
        size = path.stat().st_size
        if size > _MAX_JSON_BYTES:
            raise damaged(path, what, f"JSON of at most {_MAX_JSON_BYTES} bytes", f"{size} bytes", error=error)
        raw = path.read_bytes()
        return json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except OSError as err:
        raise damaged(path, what, "a readable file", f"{type(err).__name__}: {err}", error=error) from None
    except UnicodeDecodeError as err:
        raise damaged(path, what, "UTF-8 JSON text", f"{_sniff(raw[:16])}: {err}", error=error) from None
    except json.JSONDecodeError as err:
        found = _sniff(raw[:16]) if raw.startswith((_PICKLE_PROTO, _ZIP_MAGIC)) or not raw else f"{err}"
        raise damaged(path, what, "valid JSON", found, error=error) from None
    except RecursionError:
        raise damaged(path, what, "JSON of ordinary nesting depth", "nesting too deep to parse", error=error) from None
    except DuplicateKey as err:
        raise damaged(
            path,
            what,
            "each key once per object (JSON readers disagree on which duplicate wins)",
            f"key {str(err)!r} twice",
            error=error,
        ) from None


class DuplicateKey(ValueError):
    """A JSON object naming a key twice: Python keeps the last, other readers (engines) may keep the first."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook refusing a key given twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def read_json_object(path: Path | str, *, what: str, error: type[Exception] | None = None) -> dict[str, Any]:
    """A JSON file that must hold an object (configs, manifests, contracts)."""
    data = read_json_file(path, what=what, error=error)
    if not isinstance(data, dict):
        raise damaged(path, what, "a JSON object {...}", f"a JSON {type(data).__name__}", error=error)
    return data


def field_of(
    data: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    *,
    where: str,
    error: type[Exception] | None = None,
    positive: bool = False,
) -> Any:
    """data[key], required to be of `kind` (an int is not a bool; a float may be an int); `positive`: > 0."""
    from eaglewire.errors import EaglewireError

    kinds = kind if isinstance(kind, tuple) else (kind,)
    value = data.get(key) if isinstance(data, dict) else None
    ok = key in data and isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and positive and isinstance(value, (int, float)) and not value > 0:
        ok = False
    if not ok:
        names = " or ".join(k.__name__ for k in kinds) + (" > 0" if positive else "")
        raise (error or EaglewireError)(
            f"{where}: field {key!r} has the wrong type or value",
            expected=f"{key}: {names}",
            found="missing" if key not in data else f"{key}: {value!r} ({type(value).__name__})",
            fix="re-create the file with the tool that wrote it; a hand edit must keep each field's JSON type",
        )
    return value


def check_dataclass_fields(
    data: dict[str, Any], cls: type, *, where: str, error: type[Exception] | None = None
) -> None:
    """Every present field of `data` must have the JSON type that `cls`'s annotation names (int, float, bool,
    str, tuple/list of ints, dict, a nested dataclass, or any of those | None); ints named in
    `cls.POSITIVE_FIELDS` must be > 0. Keys are checked elsewhere (exact key sets)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    positive = set(getattr(cls, "POSITIVE_FIELDS", ()))
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kinds = _json_kinds(hints[f.name])
        if kinds is None:
            continue
        value = data[f.name]
        field_of(data, f.name, kinds, where=where, error=error, positive=f.name in positive)
        if isinstance(value, (list, tuple)) and typing.get_origin(hints[f.name]) is tuple:
            for v in value:
                field_of({"item": v}, "item", int, where=f"{where}: {f.name}", error=error)


def _json_kinds(hint: Any) -> tuple[type, ...] | None:
    import dataclasses
    import types
    import typing

    if hint is typing.Any:
        return None
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [_json_kinds(a) for a in args]
        if any(k is None for k in kinds):
            return None
        return tuple(t for k in kinds for t in k)  # type: ignore[union-attr]
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)
    if hint in (int, bool, str):
        return (hint,)
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list):
        return (list, tuple)
    if origin is dict or dataclasses.is_dataclass(hint):
        return (dict,) if origin is dict else (dict, hint)
    return None


class GuardedSafetensors:
    """A safetensors file opened by `open_safetensors`: every read failure names the file and the tensor."""

    def __init__(self, f: Any, path: Path, what: str, error: type[Exception] | None) -> None:
        self._f, self.path, self.what, self.error = f, path, what, error

    def keys(self) -> list[str]:
        return list(self._f.keys())

    def metadata(self) -> dict[str, str]:
        return self._f.metadata() or {}

    def get_slice(self, key: str) -> Any:
        return self._call(key, self._f.get_slice)

    def get_tensor(self, key: str) -> torch.Tensor:
        return self._call(key, self._f.get_tensor)

    def _call(self, key: str, fn: Any) -> Any:
        if key not in self._f.keys():
            raise damaged(
                self.path,
                self.what,
                f"a tensor named {key!r}",
                f"tensors {sorted(self._f.keys())[:8]}",
                error=self.error,
            )
        try:
            return fn(key)
        except Exception as err:  # safetensors' Rust errors have no finer type; the message says which
            raise damaged(
                self.path, self.what, f"a readable tensor {key!r}", f"{type(err).__name__}: {err}", error=self.error
            ) from None


@contextmanager
def open_safetensors(
    path: Path | str, *, what: str, error: type[Exception] | None = None
) -> Iterator[GuardedSafetensors]:
    """safe_open (no pickle, ever) after checking the file is there and is safetensors at all: a missing,
    empty, truncated, pickled or garbled file is one error naming it."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise damaged(
            path,
            what,
            f"a safetensors file {path.name}",
            "no such file" if not path.exists() else "not a regular file",
            f"point at the directory holding {path.name}",
            error,
        )
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(16)
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if n > _MAX_HEADER_BYTES:  # checked before safetensors reads (and allocates) the header
        raise damaged(
            path,
            what,
            f"a safetensors header of at most {_MAX_HEADER_BYTES} bytes (safetensors' own limit)",
            f"a header length of {n} bytes in a file of {size}",
            error=error,
        )
    if n < 2 or 8 + n > size or head[8:9] != b"{":
        found = (
            "an empty file"
            if size == 0
            else _sniff(head)
            if n < 0 or head[8:9] != b"{"
            else f"a header of {n} bytes in a file of {size} (cut off?)"
        )
        raise damaged(path, what, "safetensors (8-byte header length, then a JSON header)", found, error=error)
    try:
        f = safe_open(str(path), framework="pt")
    except Exception as err:  # SafetensorError and friends: bad header JSON, offsets beyond the file, ...
        raise damaged(path, what, "a valid safetensors file", f"{type(err).__name__}: {err}", error=error) from None
    with f:
        yield GuardedSafetensors(f, path, what, error)


def read_safetensors_file(
    path: Path | str, *, what: str, error: type[Exception] | None = None
) -> dict[str, torch.Tensor]:
    with open_safetensors(path, what=what, error=error) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def require_finite(tensors: dict[str, torch.Tensor], where: str, error: type[Exception] | None = None) -> None:
    """Refuse NaN and +-inf in any float tensor, naming it (a damaged file or a diverged run)."""
    import torch

    from eaglewire.errors import EaglewireError

    for k, t in tensors.items():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            raise (error or EaglewireError)(
                f"{where}: tensor {k!r} holds non-finite values",
                expected="finite numbers only",
                found=f"{nan} NaN, {inf} +-inf",
                fix="re-export from a healthy checkpoint (training diverged, or the file is damaged)",
            )


@contextmanager
def about_file(path: Path | str) -> Iterator[None]:
    """Re-raise an EaglewireError from parsing `path`'s content (a config's fields, a contract) with the
    file named, when the message does not name it yet: validators see values, not where they came from."""
    from eaglewire.errors import EaglewireError

    try:
        yield
    except EaglewireError as err:
        if str(path) in str(err):
            raise
        raise type(err)(
            f"{path}: {err.what}",
            expected=err.expected,
            found=err.found,
            fix=err.fix or f"re-create {Path(path).name} with the tool that wrote it",
        ) from None
