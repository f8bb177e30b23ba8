"""The conversation reader over a space of hostile files: blank-space bombs (before, between and after records,
in JSONL and JSON arrays, plain and gzip) are refused after reading a bounded number of characters; files
whose every record is skipped (any mix of skip reasons, JSONL / JSON array / gzip / with a byte-order mark,
or empty) are an error naming every reason; one good record among them is read and kept."""

import gzip
import json
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglewire.data import conversations as conv_mod
from eaglewire.data.conversations import MAX_GAP_CHARS, ReadStats, read_conversations
from eaglewire.errors import EaglewireError

GOOD = {"id": "good", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
BAD = {  # a record -> the reason the reader counts it under
    "not an object": [1, 2],
    "unknown format": {"nothing": 1},
    "empty turn": {"conversations": [{"from": "human", "value": " "}]},
    "unknown role": {"messages": [{"role": "robot", "content": "x"}]},
    "starts with assistant": {"messages": [{"role": "assistant", "content": "x"}]},
    "two user turns in a row": {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
    "messages is not a list": {"messages": "hello"},
    "non-string turn": {"turns": [3]},
}


def _write(path, text: str, gz: bool, bom: bool) -> None:
    raw = (("\ufeff" if bom else "") + text).encode()
    path.write_bytes(gzip.compress(raw, compresslevel=1) if gz else raw)


class _Counting:
    """A text file that counts the characters read from it."""

    def __init__(self, f, box):
        self.f, self.box = f, box

    def read(self, n=-1):
        out = self.f.read(n)
        self.box[0] += len(out)
        return out

    def readline(self, n=-1):
        out = self.f.readline(n)
        self.box[0] += len(out)
        return out

    def seek(self, *a):
        return self.f.seek(*a)

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()


BOMBS = {  # where the blank run stands -> the file's text around `blank`
    "before": lambda b: b + "\n" + json.dumps(GOOD) + "\n",
    "between_lines": lambda b: json.dumps(GOOD) + "\n" + b + "\n" + json.dumps(GOOD) + "\n",
    "after_lines": lambda b: json.dumps(GOOD) + "\n" + b,
    "array_start": lambda b: "[" + b + json.dumps(GOOD) + "]",
    "array_between": lambda b: "[" + json.dumps(GOOD) + "," + b + json.dumps(GOOD) + "]",
    "before_array": lambda b: b + "[" + json.dumps(GOOD) + "]",
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    where=st.sampled_from(sorted(BOMBS)),
    size=st.integers(1, 3 * MAX_GAP_CHARS),
    blank=st.sampled_from([" ", "\n", "\r\n", " \t", "\n\n\n "]),
    gz=st.booleans(),
)
def test_blank_space_bombs_are_refused_after_a_bounded_read(tmp_path, monkeypatch, where, size, blank, gz):
    run = (blank * (size // len(blank) + 1))[:size]
    path = tmp_path / ("b.json" if "array" in where else "b.jsonl")
    path = path.with_name(path.name + ".gz") if gz else path
    _write(path, BOMBS[where](run), gz, bom=False)
    box, opener = [0], conv_mod._open_text
    monkeypatch.setattr(conv_mod, "_open_text", lambda p: _Counting(opener(p), box))
    size = len(run.replace("\r\n", "\n"))  # characters as read: text mode reads CR LF as one newline
    try:
        kept = [c.id for c in read_conversations(path)]
    except EaglewireError as err:
        assert size > MAX_GAP_CHARS - 2 and "blank" in str(err) and str(path) in str(err), (size, str(err))
    else:
        assert size <= MAX_GAP_CHARS + 2 and kept and set(kept) == {"good"}, (size, kept)
    # what was looked at: the blank run up to its bound, the records, and the reader's chunks around them
    assert box[0] <= 2 * (MAX_GAP_CHARS + (1 << 20)) + 4096, box[0]


def test_the_reported_bomb_shape_gzip_of_spaces_stops_early(tmp_path):
    """A gzip of 256 MiB of spaces (the reported file held 3 GiB): refused after about a MiB decompressed."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    path = tmp_path / "bomb.jsonl.gz"
    with open(path, "wb") as f:
        for _ in range(256):
            f.write(z.compress(block))
        f.write(z.flush())
    with pytest.raises(EaglewireError, match="blank space"):
        list(read_conversations(path))


records = st.lists(st.sampled_from(sorted(BAD)), min_size=0, max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reasons=records,
    array=st.booleans(),
    gz=st.booleans(),
    bom=st.booleans(),
    bad_line=st.booleans(),
    good_at=st.one_of(st.none(), st.integers(0, 8)),
)
def test_no_usable_record_is_an_error_naming_the_reasons(tmp_path, reasons, array, gz, bom, bad_line, good_at):
    recs = [BAD[r] for r in reasons]
    if good_at is not None:
        recs.insert(min(good_at, len(recs)), GOOD)
    if array:
        text = json.dumps(recs, indent=1)
    else:
        text = "".join(json.dumps(r) + "\n" for r in recs) + ("{not json\n" if bad_line else "")
    path = (
        tmp_path / ("d.json" if array else "d.jsonl") if not gz else tmp_path / ("d.json.gz" if array else "d.jsonl.gz")
    )
    _write(path, text, gz, bom)
    stats = ReadStats()
    expect = {r: reasons.count(r) for r in reasons}
    if bad_line and not array:
        expect["invalid JSON"] = 1
    try:
        kept = [c.id for c in read_conversations(path, stats)]
    except EaglewireError as err:
        assert good_at is None, str(err)
        msg = str(err)
        assert str(path) in msg and "no usable conversation" in msg and "fix:" in msg
        assert all(r in msg for r in expect) and ("empty source" in msg) == (not expect), msg
    else:
        assert good_at is not None and kept == ["good"]
        assert dict(stats.skipped) == expect  # a BOM is not a skipped first record, nothing skipped silently


def test_a_json_array_with_a_byte_order_mark_is_read_as_an_array(tmp_path):
    path = tmp_path / "bom.json"
    _write(path, json.dumps([GOOD] * 80), gz=False, bom=True)
    stats = ReadStats()
    assert len(list(read_conversations(path, stats))) == 80 and stats.read == 80


def test_conversations_that_all_tokenize_to_nothing_are_an_error(monkeypatch):
    """The same class one step later: conversations came, none gave a trained token (here: every template
    rewrites history) -> an error with the tokenizer's counts, not an empty training set."""
    from eaglewire.data import samples as samples_mod
    from eaglewire.data.conversations import Conversation, Turn

    def mismatch(*args, **kwargs):
        raise samples_mod.TemplateMismatch("rewrites history")

    monkeypatch.setattr(samples_mod, "render_with_mask", mismatch)
    conv = Conversation("c", (Turn("user", "q"), Turn("assistant", "a")))
    with pytest.raises(EaglewireError, match="template mismatch 2"):
        samples_mod.tokenize_conversations(object(), [conv, conv], max_length=8)
    assert samples_mod.tokenize_conversations(object(), [], max_length=8) == []  # nothing asked: nothing to say
