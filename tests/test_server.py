"""`eaglewire serve` over real HTTP on loopback: completions, streaming, usage stats, metrics, 4xx errors,
concurrent requests queued (none lost), and output equal to plain greedy decoding."""

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
import torch

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.serve.server import build_server
from eaglewire.decoding.engine import greedy_reference
from eaglewire.decoding.runtime import StaticRuntime
from eaglewire.decoding.tree import TreeShape
from eaglewire.target.loader import load_target, resolve_target


def _tiny_target_dir(d):
    """A tiny random Llama on disk with the real SmolLM2 tokenizer and chat template."""
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[1])
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(d / "target")
    tok.save_pretrained(d / "target")
    return d / "target"


STARTED: list[str] = []  # what the server's start said (build_server's log)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tiny import build_draft

    d = tmp_path_factory.mktemp("srv")
    target = load_target(str(_tiny_target_dir(d)))
    draft, contract = build_draft(target, taps=(1, 2, 3))
    save_checkpoint(draft, contract, d / "draft")
    httpd = build_server(target, load_checkpoint(d / "draft", target=target),
                         TreeShape(num_steps=3, topk=2, num_draft_tokens=5), "tiny", 256, 64, "127.0.0.1", 0,
                         log=STARTED.append)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", target
    httpd.shutdown()


def test_start_says_how_the_gemm_layouts_were_chosen(server):
    assert any(m.startswith(("calibrating GEMM layouts", "reusing GEMM layout calibration from"))
               for m in STARTED), STARTED


def _post(url, body, raw=None):
    req = urllib.request.Request(url, data=raw if raw is not None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_chat_completion_equals_greedy_and_reports_usage(server):
    url, target = server
    msgs = [{"role": "user", "content": "Say something."}]
    status, body = _post(url + "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 12})
    assert status == 200, body
    data = json.loads(body)
    ids = target.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True,
                                               return_tensors="pt")["input_ids"]
    ref = greedy_reference(StaticRuntime(target, max_len=128), ids, 12, eos={target.tokenizer.eos_token_id})
    assert data["choices"][0]["message"]["content"] == target.tokenizer.decode(ref, skip_special_tokens=True)
    usage = data["usage"]
    assert usage["completion_tokens"] == len(ref) and usage["verify_steps"] >= 1 and usage["tau"] >= 1


def test_streaming_and_completions(server):
    url, _ = server
    status, body = _post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                         "max_tokens": 8, "stream": True})
    events = [l[6:] for l in body.splitlines() if l.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] <= 8 and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    status, body = _post(url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5})
    assert status == 200 and json.loads(body)["object"] == "text_completion"


@pytest.mark.parametrize("body,raw,status,fragment", [
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, None, 404, "unknown model"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, None, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x " * 400}], "max_tokens": 60}, None, 400, "exceeds the context"),
    (None, b"{not json", 400, "not valid JSON"),
    ({"messages": "hello"}, None, 400, "messages must be"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, None, 400, "temperature"),
])
def test_bad_requests_get_4xx(server, body, raw, status, fragment):
    url, _ = server
    code, text = _post(url + "/v1/chat/completions", body, raw)
    assert code == status and fragment in json.loads(text)["error"]["message"]


def test_concurrent_requests_are_queued_not_lost_and_metrics(server):
    url, _ = server
    body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 6}
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _post(url + "/v1/chat/completions", body), range(8)))
    assert [s for s, _ in results] == [200] * 8
    texts = {json.loads(b)["choices"][0]["message"]["content"] for _, b in results}
    assert len(texts) == 1  # greedy: every queued request got the same full answer
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "eaglewire_requests_total" in metrics and "eaglewire_acceptance_length" in metrics
    requests = int(next(l.split()[1] for l in metrics.splitlines() if l.startswith("eaglewire_requests_total")))
    assert requests >= 8
