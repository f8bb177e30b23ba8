"""The cache checks what it serves (eaglewire.cache): a converted file damaged in place with its size kept is
rebuilt, never served (a write moves its modification time: full sha256; a change hitting a sampled block is
caught even with the time put back); a damaged marker (any bytes, any JSON) means "rebuild", never a
traceback; a marker from before digests gets them on first use without a rebuild."""

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire import cache

CASES = 25  # generated cases per test in CI (a 1.25 MiB file each, no model)
SIZE = 5 << 18  # above the 1 MiB a sampled digest hashes whole


def _builder(calls: list):
    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "model.safetensors").write_bytes(bytes(range(256)) * (SIZE // 256))
        (tmp / "config.json").write_text('{"layers": 2}')

    return build


def _built(d: Path, calls: list) -> Path:
    path, built = cache.ensure_dir(d / "t", {"v": 1}, _builder(calls))
    assert built
    return path


@settings(max_examples=CASES, deadline=None)
@given(
    start=st.integers(0, SIZE - 1),
    length=st.integers(1, 1 << 20),
    byte=st.integers(0, 255),
    name=st.sampled_from(["model.safetensors", "config.json"]),
)
def test_a_file_changed_in_place_with_its_size_kept_is_rebuilt(start, length, byte, name):
    with tempfile.TemporaryDirectory() as d:
        calls: list = []
        path = _built(Path(d), calls)
        f = path / name
        raw = bytearray(f.read_bytes())
        start %= len(raw)
        patch = bytes([byte]) * min(length, len(raw) - start)
        if raw[start : start + len(patch)] == patch:
            return  # the drawn change changes nothing
        raw[start : start + len(patch)] = patch
        f.write_bytes(bytes(raw))  # same size
        assert not cache.is_complete(path, {"v": 1})
        _, built = cache.ensure_dir(path, {"v": 1}, _builder(calls))
        assert built and len(calls) == 2 and cache.is_complete(path, {"v": 1})
        assert [p.name for p in Path(d).iterdir()] == ["t"]


def test_a_zeroed_sampled_block_is_caught_with_the_time_put_back_and_a_touch_is_not_damage(tmp_path):
    import os

    calls: list = []
    path = _built(tmp_path, calls)
    f = path / "model.safetensors"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: hashed in full, found intact
    assert cache.is_complete(path, {"v": 1})
    assert json.loads((path / cache.MARKER).read_text())["digests"][f.name]["mtime_ns"] == f.stat().st_mtime_ns
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(SIZE // 2)
        fh.write(bytes(128 << 10))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not cache.is_complete(path, {"v": 1})


markers = st.one_of(
    st.binary(max_size=64),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
        max_leaves=8,
    ).map(lambda v: json.dumps(v).encode()),
    st.sampled_from(
        [
            b'{"fingerprint": {"v": 1}, "files": {"config.json": "13"}}',
            b'{"fingerprint": {"v": 1}, "files": []}',
            b'{"fingerprint": {"v": 1}, "files": {"config.json": true}}',
            b'{"fingerprint": {"v": 1}, "files": {"config.json": 13}, "digests": [1]}',
            b"\xff\xfe{}",
            b"[" * 100000,
        ]
    ),
)


@settings(max_examples=CASES, deadline=None)
@given(marker=markers)
def test_a_damaged_marker_means_rebuild_never_a_traceback(marker):
    with tempfile.TemporaryDirectory() as d:
        calls: list = []
        path = _built(Path(d), calls)
        (path / cache.MARKER).write_bytes(marker)
        assert not cache.is_complete(path, {"v": 1})
        _, built = cache.ensure_dir(path, {"v": 1}, _builder(calls))
        assert built and cache.is_complete(path, {"v": 1})


def test_a_marker_from_before_digests_gets_them_without_a_rebuild(tmp_path):
    calls: list = []
    path = _built(tmp_path, calls)
    meta = json.loads((path / cache.MARKER).read_text())
    del meta["digests"]
    (path / cache.MARKER).write_text(json.dumps(meta))
    _, built = cache.ensure_dir(path, {"v": 1}, _builder(calls))
    assert not built and len(calls) == 1
    assert set(json.loads((path / cache.MARKER).read_text())["digests"]) == {"model.safetensors", "config.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
