"""Self-prompts (Magpie): the pre-query cut, what is kept or skipped, kill-and-resume, the /completions client."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglewire.data.conversations import read_conversations
from eaglewire.data.regenerate import read_done
from eaglewire.data.self_prompts import PromptSettings, banned_keys, normalize, pre_query_text, sample_self_prompts
from eaglewire.data.server_client import CompletionSampler
from eaglewire.errors import EaglewireError

S = PromptSettings(batch_size=4, min_chars=8)
META = {"kind": "self-prompts", "target": "fake"}


class TemplateTok:
    def __init__(self, template="<sys>be nice</sys><user>{}</user><bot>", verbatim=True):
        self.chat_template, self.template, self.verbatim = "jinja", template, verbatim

    def apply_chat_template(self, messages, tokenize=False):
        content = messages[0]["content"]
        return self.template.format(content if self.verbatim else content[::-1])


def test_pre_query_text_is_the_template_up_to_the_users_text():
    assert pre_query_text(TemplateTok()) == "<sys>be nice</sys><user>"
    with pytest.raises(EaglewireError, match="verbatim"):
        pre_query_text(TemplateTok(verbatim=False))
    no_template = TemplateTok()
    no_template.chat_template = None
    with pytest.raises(EaglewireError, match="chat template"):
        pre_query_text(no_template)


# seed -> (text, finish): duplicates (case and spacing differ), one unfinished, one too short, one benchmark
# question and one sharing a benchmark question's first 60 characters
BENCH = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences."
SAMPLES = {
    0: ("How do plants grow?", "stop"),
    1: ("how do  plants grow?", "stop"),
    2: ("Write a poem about", "length"),
    3: ("Hi?", "stop"),
    4: (BENCH, "stop"),
    5: (BENCH[:70] + " and food.", "stop"),
    6: ("Explain recursion to a child.", "stop"),
    7: ("What is the capital of Peru?", "stop"),
}


def fake_sampler(fail_at=None):
    def sample(seed):
        if seed == fail_at:
            raise KeyboardInterrupt
        text, finish = SAMPLES.get(seed, (f"Question number {seed} about topic {seed * 7}?", "stop"))
        return text, finish, len(text.split())

    return sample


def kept(path):
    return {r["id"]: r["messages"][0]["content"] for r in read_done(path) if "messages" in r}


def test_kept_and_skipped_prompts_are_recorded_and_read_as_one_turn_chats(tmp_path):
    out = tmp_path / "p.jsonl.gz"
    stats = sample_self_prompts(fake_sampler(), out, 12, S, META, banned_keys([BENCH]))
    recs = {r["id"]: r for r in read_done(out)}
    assert len(recs) == 12 and stats.drawn == 12 and stats.kept == 7
    assert stats.skipped == {"duplicate": 1, "unfinished": 1, "too short": 1, "benchmark question": 2}
    assert {recs[f"self-{k:07d}"].get("skipped") for k in (2, 3, 4, 5)} == {
        "unfinished",
        "too short",
        "benchmark question",
    }
    # exactly one of the two spellings of the duplicate is kept (which one depends on completion order)
    assert sum("messages" in recs[f"self-{k:07d}"] for k in (0, 1)) == 1
    convs = list(read_conversations(out))
    assert len(convs) == 7 and all(len(c.turns) == 1 and c.turns[0].role == "user" for c in convs)


def test_a_killed_run_resumes_to_the_same_prompts(tmp_path):
    whole, cut = tmp_path / "whole.jsonl.gz", tmp_path / "cut.jsonl.gz"
    sample_self_prompts(fake_sampler(), whole, 30, S, META, set())
    with pytest.raises(KeyboardInterrupt):
        sample_self_prompts(fake_sampler(fail_at=17), cut, 30, S, META, set())
    partial = read_done(cut)
    assert 0 < len(partial) < 30
    stats = sample_self_prompts(fake_sampler(), cut, 30, S, META, set())
    ids = [r["id"] for r in read_done(cut)]
    assert len(ids) == len(set(ids)) == 30 and stats.drawn == 30
    # the same prompts up to which spelling of a duplicate was kept (completion order decides that)
    assert {normalize(x) for x in kept(cut).values()} == {normalize(x) for x in kept(whole).values()}
    # more samples later: the file grows by exactly the new seeds
    sample_self_prompts(fake_sampler(), cut, 34, S, META, set())
    assert len(read_done(cut)) == 34


def test_other_settings_on_an_existing_file_are_refused(tmp_path):
    out = tmp_path / "p.jsonl.gz"
    sample_self_prompts(fake_sampler(), out, 4, S, META, set())
    with pytest.raises(EaglewireError, match="other settings"):
        sample_self_prompts(fake_sampler(), out, 4, PromptSettings(batch_size=4, temperature=0.7), META, set())
    sample_self_prompts(fake_sampler(), out, 6, PromptSettings(batch_size=2, min_chars=8), META, set())  # a knob
    assert len(read_done(out)) == 6


class _Completions(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions"
        text = f"prompt {body['prompt']} seed {body['seed']} t {body['temperature']}"
        data = json.dumps(
            {
                "choices": [{"text": text, "finish_reason": "length" if body["seed"] == 9 else "stop"}],
                "usage": {"completion_tokens": body["max_tokens"] - 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_completion_sampler_sends_token_ids_and_the_seed():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        sample = CompletionSampler(url, "smol", [5, 6, 7], max_tokens=12, temperature=1.0, top_p=1.0, timeout=10)
        assert sample(3) == ("prompt [5, 6, 7] seed 3 t 1.0", "stop", 11)
        assert sample(9)[1] == "length"
    finally:
        server.shutdown()
    with pytest.raises(EaglewireError, match="failed"):
        CompletionSampler(url, "smol", [1], max_tokens=4, temperature=1.0, top_p=1.0, timeout=2)(0)
