"""Sizes read from a file are bounded where the file is read: a safetensors header (its length, its tensors'
shapes and offsets) through the one guarded reader, a regeneration file's gzip members through `read_done`;
and a mutated regeneration file never loses an intact record nor is changed by a run that fails on it.

CI runs CASES generated headers and CASES generated regeneration files."""

import gzip
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_mutated_files import _mutate_bytes

from eaglewire.data import regen_file
from eaglewire.data import regenerate as regen
from eaglewire.data.regenerate import GenerationSettings, Reply, append_records, read_done
from eaglewire.errors import EaglewireError
from eaglewire.safeio import open_safetensors

CASES = 25
SETTINGS = settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
huge = st.one_of(st.integers(0, 64), st.integers(2**31, 2**64 - 1), st.just(-1))


def _safetensors(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> Path:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)
    return path


def _open(path: Path) -> None:
    with open_safetensors(path, what="a test file") as f:
        for k in f.keys():
            f.get_tensor(k)


@SETTINGS
@given(
    shape=st.lists(huge, max_size=3),
    start=huge,
    end=huge,
    dtype=st.sampled_from(["F32", "BF16", "I64", "Q9", ""]),
    data_len=st.integers(0, 64),
    length=st.one_of(st.none(), st.integers(0, 64), st.integers(2**31, 2**64 - 1)),
)
def test_a_hostile_safetensors_header_is_refused_naming_the_file(shape, start, end, dtype, data_len, length):
    """Shapes and offsets from 0 to 2^64, unknown dtypes, header lengths beyond the file: opened and read only
    when it all adds up to the bytes there, else one clean error naming the file; nothing is allocated from a
    claimed size (the test would run out of memory or time)."""
    with tempfile.TemporaryDirectory() as d:
        path = _safetensors(
            Path(d) / "w.safetensors",
            {"t": {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}},
            b"\0" * data_len,
            length,
        )
        try:
            _open(path)
            assert 0 <= start <= end <= data_len  # accepted only when the header describes the bytes there
        except EaglewireError as err:
            assert str(path) in err.what and err.expected and err.found and err.fix


def test_a_header_length_over_the_formats_cap_is_refused_before_it_is_read(tmp_path):
    path = _safetensors(tmp_path / "w.safetensors", b"{" + b" " * 30, b"", length=150_000_000)
    os.truncate(path, 200_000_000)  # sparse: the claimed header fits inside the file
    with pytest.raises(EaglewireError) as err:
        _open(path)
    assert "at most 100000000 bytes" in err.value.expected and "150000000" in err.value.found


def test_a_gzip_bomb_member_stops_at_the_member_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(regen_file, "MAX_MEMBER_BYTES", 1 << 20)
    path = tmp_path / "r.jsonl.gz"
    append_records(path, [{"id": "a", "messages": []}])
    first = path.stat().st_size
    with open(path, "ab") as f:
        f.write(gzip.compress(b" " * (8 << 20), mtime=0))  # 8 MiB of blanks in ~8 kB
    before = path.read_bytes()
    for repair in (False, True):
        with pytest.raises(EaglewireError) as err:
            read_done(path, repair=repair)
        assert f"offset {first}" in err.value.what and "MAX_MEMBER_BYTES" in err.value.found
    assert path.read_bytes() == before


def test_many_members_read_back_in_order(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    for i in range(100):
        append_records(path, [{"id": f"c{i}", "messages": []}])
    assert [r["id"] for r in read_done(path)] == [f"c{i}" for i in range(100)]


RECORDS = [
    [
        {"id": f"c{i}{j}", "messages": [{"role": "user", "content": f"q{i}{j}"}, {"role": "assistant", "content": "a"}]}
        for j in range(2)
    ]
    for i in range(3)
]


class _Gen:
    """Answers "a" to everything (a cut tail's conversations are generated again)."""

    def identity(self):
        return {"engine": "test"}

    def prompt_tokens(self, messages):
        return 1

    def generate(self, prompts, seed):
        return [Reply("a", 1, "stop") for _ in prompts]


@SETTINGS
@given(data=st.data())
def test_a_mutated_regeneration_file(data):
    """Flipped, cut or inserted bytes: read_done returns a prefix of the records written (a cut tail) or stops
    naming the file and the member's offset; a run resuming onto it either keeps every intact record or
    fails leaving the file byte for byte as it was."""
    with tempfile.TemporaryDirectory() as d:
        out, src = Path(d) / "r.jsonl.gz", Path(d) / "src.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for batch in RECORDS for r in batch))
        s = GenerationSettings(max_new_tokens=2, batch_size=2)
        regen.check_meta(out, regen.regen_meta(str(src), s, _Gen()))
        for batch in RECORDS:
            append_records(out, batch)
        out.write_bytes(_mutate_bytes(out.read_bytes(), data))
        before = out.read_bytes()
        written = [r for batch in RECORDS for r in batch]
        try:
            kept = read_done(out)
            assert kept == written[: len(kept)]  # a prefix: a cut tail is dropped, nothing else
        except EaglewireError as err:
            assert str(out) in err.what and "offset" in err.what and err.fix
            kept = None
        try:
            regen.regenerate(str(src), out, _Gen(), s, limit=len(written))
            assert kept is not None
            after = read_done(out)
            assert after[: len(kept)] == kept  # every intact record kept as it was
            assert sorted(r["id"] for r in after) == sorted(r["id"] for r in written)  # none lost or doubled
        except EaglewireError as err:
            assert out.read_bytes() == before and str(out.name) in str(err)
