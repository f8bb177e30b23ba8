"""Conversation readers: three formats, JSON and JSONL, truncated arrays, malformed records counted."""

import gzip
import json

import pytest

from eaglewire.data.conversations import ReadStats, read_conversations


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_three_formats_jsonl(tmp_path):
    lines = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {
            "id": "b",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ],
        },
        {"question_id": 81, "turns": ["first", "second"]},
    ]
    p = _write(tmp_path / "c.jsonl", "\n".join(json.dumps(x) for x in lines))
    convs = list(read_conversations(p))
    assert [c.id for c in convs] == ["a", "b", "81"]
    assert convs[1].turns[0].role == "system" and convs[2].user_turns == ["first", "second"]


def test_truncated_json_array_keeps_complete_records(tmp_path):
    good = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(3)]
    text = json.dumps(good, indent=2)
    p = _write(tmp_path / "t.json", text[: text.rindex('"q2"')])  # cut inside the last record
    stats = ReadStats()
    assert [c.id for c in read_conversations(p, stats)] == ["0", "1"]
    assert stats.skipped == {"truncated": 1} and stats.read == 3


def test_malformed_records_counted_and_skipped(tmp_path):
    recs = [
        {"id": "ok", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"id": "empty", "conversations": [{"from": "human", "value": "  "}]},
        {"id": "role", "conversations": [{"from": "robot", "value": "x"}]},
        {"id": "twice", "conversations": [{"from": "human", "value": "x"}, {"from": "human", "value": "y"}]},
        {"id": "enc", "conversations": [{"from": "human", "value": "bad \ud800 text"}]},
        {"id": "first", "conversations": [{"from": "gpt", "value": "x"}]},
        {"nothing": 1},
    ]
    body = "\n".join(json.dumps(r) for r in recs) + "\n{not json\n"
    p = tmp_path / "m.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(body)
    stats = ReadStats()
    assert [c.id for c in read_conversations(p, stats)] == ["ok"]
    assert stats.skipped == {
        "empty turn": 1,
        "unknown role": 1,
        "two user turns in a row": 1,
        "bad encoding": 1,
        "starts with assistant": 1,
        "unknown format": 1,
        "invalid JSON": 1,
    }
    assert "kept 1" in stats.summary() and stats.read == 8


def test_embedded_sharegpt_source_parses():
    stats = ReadStats()
    first = [c for _, c in zip(range(50), read_conversations("sharegpt", stats))]
    assert len(first) == 50 and all(c.user_turns for c in first)


def test_missing_source(tmp_path):
    with pytest.raises(Exception, match="not found"):
        list(read_conversations(tmp_path / "nope.json"))


def test_continuation_parts_drop_the_opening_answer(tmp_path, monkeypatch):
    from eaglewire.data import conversations as mod

    recs = [
        {"id": "whole", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {
            "id": "part_1",
            "conversations": [
                {"from": "gpt", "value": "rest of an answer"},
                {"from": "human", "value": "next q"},
                {"from": "gpt", "value": "a2"},
            ],
        },
        {"id": "part_2", "conversations": [{"from": "gpt", "value": "only an answer"}]},
    ]
    p = _write(tmp_path / "parts.jsonl", "\n".join(json.dumps(r) for r in recs))
    monkeypatch.setitem(mod.CONTINUATION_SOURCES, "test-parts", str(p))
    stats = ReadStats()
    convs = list(read_conversations("test-parts", stats))
    assert [c.id for c in convs] == ["part_1"]
    assert [(t.role, t.content) for t in convs[0].turns] == [("user", "next q"), ("assistant", "a2")]
    assert stats.skipped == {"not a continuation part": 1, "no turns": 1}
    assert [c.id for c in read_conversations(p)] == ["whole"]  # the plain reading is unchanged


def test_embedded_sharegpt_parts_are_the_conversations_sharegpt_skips():
    plain, parts = ReadStats(), ReadStats()
    n = sum(1 for _ in zip(range(3000), read_conversations("sharegpt", plain)))
    first = [c for _, c in zip(range(20), read_conversations("sharegpt-parts", parts))]
    assert n == 3000 and len(first) == 20 and all(c.turns[0].role == "user" for c in first)
    assert plain.skipped["starts with assistant"] > 0


def test_shipped_corpora_read_whole_and_record_how_they_were_made():
    """Every shipped regenerated corpus parses (a corrupt commit fails here, not in a later capture), and
    its meta says which source and settings made it: the parts were answered one turn each."""
    from eaglewire.data.conversations import PACKAGED_SOURCES, resolve_source

    for name in [n for n, (pkg, _, _) in PACKAGED_SOURCES.items() if pkg == "eaglewire" and "regen" in n]:
        stats = ReadStats()
        convs = list(read_conversations(name, stats))
        meta = json.loads(resolve_source(name).with_name(resolve_source(name).name + ".meta.json").read_text())
        # the only refusals: prompts too long to answer, and answers the target ended at once (EOS first)
        allowed = {"skipped at regeneration (prompt too long)", "empty turn"}
        assert convs and set(stats.skipped) <= allowed and stats.skipped["empty turn"] <= 2, (name, stats.summary())
        assert all(c.turns[-1].role == "assistant" for c in convs), name
        if name == "smollm2-regen-parts":
            assert meta["source"] == "sharegpt-parts" and meta["settings"]["max_turns"] == 1
            assert len(convs) == 6080 and all(len(c.user_turns) == 1 for c in convs)
        if name == "smollm2-regen-self":  # every kept self-prompt answered, one turn each
            prompts = list(read_conversations(meta["source"]))
            assert meta["settings"]["max_turns"] == 1 and len(convs) == len(prompts) == 3495
            assert sorted(c.user_turns[0] for c in convs) == sorted(p.user_turns[0] for p in prompts)
