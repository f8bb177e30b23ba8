"""The regeneration output file: an append-only gzip JSONL (one gzip member per appended batch of records)
with a `.meta.json` sidecar naming the target and the settings it was written with.

A kill during an append leaves at most that member cut off; the next writer drops it (its bytes kept beside
the file), readers never repair. Kept apart from the regeneration loop (eaglewire.data.regenerate) because
other writers of conversation files (eaglewire.data.self_prompts) append and resume through the same rules.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from pathlib import Path

from eaglewire.errors import EaglewireError
from eaglewire.safeio import atomic_write_bytes, atomic_write_json, read_json_object

MAX_MEMBER_BYTES = 256 << 20  # one appended batch of records, decompressed (a batch of ShareGPT answers: ~1 MB)


def read_done(path: Path, *, repair: bool = False) -> list[dict]:
    """All complete records of a regeneration file. A cut-off trailing gzip member (a killed run: a prefix of
    a valid member) is ignored; with `repair` (only the process that will append next) the file is rewritten
    without it, the cut-off bytes kept beside it first. A damaged member (bad deflate data, CRC, UTF-8 or
    JSON) is an error naming its byte offset, wherever it is: skipping it would drop every intact record
    after it, as is a member of over MAX_MEMBER_BYTES. Readers must not repair: a writer may be mid-append."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    view, records, pos = memoryview(raw), [], 0  # a view: slicing bytes would copy the rest once per member
    while pos < len(raw):
        d = zlib.decompressobj(wbits=31)  # one gzip member
        try:  # at most MAX_MEMBER_BYTES + 1 out: a gzip bomb stops here instead of taking the memory
            text = d.decompress(view[pos:], MAX_MEMBER_BYTES + 1)
        except zlib.error as err:
            raise _damaged(path, pos, len(raw), f"gzip data error: {err}") from None
        if len(text) > MAX_MEMBER_BYTES:
            raise _damaged(path, pos, len(raw), f"a member of over {MAX_MEMBER_BYTES} bytes (MAX_MEMBER_BYTES)")
        if not d.eof:
            break  # a prefix of a member (all its bytes read, the limit not reached): a kill during append_records
        try:
            # split on "\n" only: str.splitlines also breaks at U+2028, U+0085, ... which json.dumps
            # (ensure_ascii=False) leaves raw inside strings; that once made a reader stop at such a record
            batch = [json.loads(line) for line in text.decode("utf-8").split("\n") if line]
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise _damaged(path, pos, len(raw), f"{type(err).__name__}: {err}") from None
        if not all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in batch):
            raise _damaged(path, pos, len(raw), "a record that is not a JSON object with a string 'id'")
        records.extend(batch)
        pos = len(raw) - len(d.unused_data)
    if repair and pos != len(raw):
        _cut_tail(path, raw, pos)
    return records


def _damaged(path: Path, offset: int, size: int, found: str) -> EaglewireError:
    return EaglewireError(
        f"{path} is damaged at byte offset {offset} (a gzip member of records)",
        expected="whole gzip members of JSON records, as eaglewire appends them "
        "(only a cut-off last member, a killed run's, is repaired)",
        found=f"{found} (member at offset {offset} of {size} bytes)",
        fix=f"restore {path.name} from a copy, or keep its first {offset} bytes "
        f"(`head -c {offset}`) to drop this member and everything after it",
    )


def _cut_tail(path: Path, raw: bytes, good_end: int) -> None:
    """Drop a cut-off last member: its bytes go to a backup first (prefix + backup = the file as it was)."""
    backup = path.with_name(f"{path.name}.tail-at-{good_end}.bak")
    atomic_write_bytes(backup, raw[good_end:])
    tmp = path.with_name(f".{path.name}.repair-{os.getpid()}")
    tmp.write_bytes(raw[:good_end])
    os.replace(tmp, path)
    print(
        f"note: {path}: dropped a cut-off last record batch ({len(raw) - good_end} bytes at offset "
        f"{good_end}, an interrupted write); its bytes are kept in {backup}",
        file=sys.stderr,
    )


def append_records(path: Path, records: list[dict]) -> None:
    """Append one gzip member and fsync: a kill leaves at most this member cut off (repaired on resume)."""
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    with open(path, "ab") as f:
        f.write(gzip.compress(payload, mtime=0))
        f.flush()
        os.fsync(f.fileno())


def check_meta(path: Path, meta: dict) -> None:
    """The settings `path` was regenerated with must be these; a file without them was not written by this
    command (resuming would append to someone else's file), so it is refused."""
    side = path.with_name(path.name + ".meta.json")
    if not side.exists() and (path.exists() or path.is_symlink()) and not (path.is_file() and path.stat().st_size == 0):
        raise EaglewireError(
            f"--out {path} exists and is not a regeneration file of this command",
            expected=f"a new file, or one this command wrote (with {side.name} beside it)",
            found=f"{path} ({'a folder' if path.is_dir() else 'a file'}) without {side.name}",
            fix="pass a new --out; eaglewire never appends to or replaces a file it did not write",
        )
    if side.exists():
        found = read_json_object(side, what="a regeneration settings file")
        if found != meta:
            diff = sorted(k for k in meta.keys() | found.keys() if meta.get(k) != found.get(k))
            raise EaglewireError(
                f"{path} was regenerated with other settings or another target",
                expected=json.dumps({k: meta.get(k) for k in diff}),
                found=json.dumps({k: found.get(k) for k in diff}),
                fix="use another --out, or the same target and settings to resume",
            )
    else:
        atomic_write_json(side, meta)
