"""Regeneration: resumable append-only output, kill-and-resume equals an uninterrupted run, server client."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglewire.data.regenerate import GenerationSettings, Reply, read_done, regenerate
from eaglewire.data.server_client import ServerGenerator
from eaglewire.errors import EaglewireError


class FakeTok:
    def apply_chat_template(self, messages, **_):
        return {"input_ids": list(range(sum(len(m["content"].split()) for m in messages)))}


class EchoGenerator:
    """Deterministic stand-in for the target: answers with the history length and the question."""

    def __init__(self, die_after=None):
        self.calls, self.die_after = 0, die_after

    def identity(self):
        return {"kind": "echo"}

    def prompt_tokens(self, messages):
        return len(FakeTok().apply_chat_template(messages)["input_ids"])

    def generate(self, prompts, seed):
        self.calls += 1
        if self.die_after is not None and self.calls > self.die_after:
            raise KeyboardInterrupt
        return [Reply(text=f"answer {len(p)} to {p[-1]['content']}", new_tokens=3, finish="stop") for p in prompts]


@pytest.fixture()
def source(tmp_path):
    recs = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": "old answer"},
                {"from": "human", "value": f"follow-up {i}"},
            ],
        }
        for i in range(20)
    ]
    recs.append({"id": "long", "conversations": [{"from": "human", "value": "word " * 50}]})
    p = tmp_path / "src.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs))
    return str(p)


S = GenerationSettings(batch_size=4, max_turns=2, max_prompt_tokens=20)


def test_regenerates_every_turn_on_regenerated_history(tmp_path, source):
    out = tmp_path / "r.jsonl.gz"
    stats = regenerate(source, out, EchoGenerator(), S, limit=100)
    recs = {r["id"]: r for r in read_done(out)}
    assert len(recs) == 21 and stats.skipped_long == 1 and recs["long"] == {"id": "long", "skipped": "prompt too long"}
    msgs = recs["c3"]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == "answer 1 to question 3"  # the old ShareGPT answer is gone
    assert msgs[3]["content"] == "answer 3 to follow-up 3"  # conditioned on the regenerated history


def test_kill_and_resume_equals_uninterrupted(tmp_path, source):
    ref = tmp_path / "ref.jsonl.gz"
    regenerate(source, ref, EchoGenerator(), S, limit=100)
    out = tmp_path / "r.jsonl.gz"
    with pytest.raises(KeyboardInterrupt):
        regenerate(source, out, EchoGenerator(die_after=5), S, limit=100)
    partial = read_done(out)
    assert 0 < len(partial) < 21
    with open(out, "ab") as f:  # a member cut off mid-write by the kill
        f.write(ref.read_bytes()[:30])
    regenerate(source, out, EchoGenerator(), S, limit=100)
    got = read_done(out)
    assert len(got) == len({r["id"] for r in got}) == 21  # nothing duplicated or lost
    assert sorted(got, key=lambda r: r["id"]) == sorted(read_done(ref), key=lambda r: r["id"])


def test_limit_counts_done_and_meta_refuses_other_settings(tmp_path, source):
    out = tmp_path / "r.jsonl.gz"
    regenerate(source, out, EchoGenerator(), S, limit=8)
    assert len(read_done(out)) == 8
    regenerate(source, out, EchoGenerator(), S, limit=12)
    assert len(read_done(out)) == 12
    with pytest.raises(EaglewireError, match="other settings") as err:
        regenerate(source, out, EchoGenerator(), GenerationSettings(batch_size=4, max_new_tokens=7), limit=12)
    assert '"max_new_tokens": 7' in str(err.value)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions"
        text = f"server says {body['messages'][-1]['content']} (max {body['max_tokens']})"
        data = json.dumps(
            {
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 5},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_server_client_against_loopback_http(tmp_path, source):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        gen = ServerGenerator(url, "smol", S, tokenizer=FakeTok(), timeout=10)
        stats = regenerate(source, tmp_path / "s.jsonl.gz", gen, S, limit=4)
        recs = read_done(tmp_path / "s.jsonl.gz")
        assert stats.new_tokens == 5 * 8 and len(recs) == 4
        assert recs[0]["messages"][1]["content"].startswith("server says question")
    finally:
        server.shutdown()
    dead = ServerGenerator(url, "smol", S, tokenizer=FakeTok(), timeout=2)
    with pytest.raises(EaglewireError, match="failed"):
        dead.generate([[{"role": "user", "content": "x"}]], seed=0)


def test_unicode_line_separators_inside_answers_survive(tmp_path):
    from eaglewire.data.regenerate import append_records

    out = tmp_path / "r.jsonl.gz"
    odd = [
        {"id": "a", "messages": [{"role": "assistant", "content": "one\u2028two\x85three\u2029"}]},
        {"id": "b", "messages": [{"role": "assistant", "content": "plain"}]},
    ]
    append_records(out, odd)
    append_records(out, [{"id": "c", "messages": []}])
    got = read_done(out, repair=True)
    assert [r["id"] for r in got] == ["a", "b", "c"] and got[0] == odd[0]
    assert len(read_done(out)) == 3  # repair kept every member
