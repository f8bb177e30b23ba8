"""The server's edges (serve/server.py, serve/chat_requests.py) over a space of raw requests: methods in any case
(HEAD, OPTIONS, PUT, an HTTP/2 preface, junk), targets (routes, with a query string, absolute-form, unknown,
70 KB long), versions, header sets (duplicated or conflicting Content-Length, Transfer-Encoding with or without
it, 100 KB headers, 10,000 headers) and bodies with loosely typed fields. Every answer is a whole HTTP/1.x answer;
every refusal carries the one JSON error body {"error": {message, type, code = status}}; nothing bad is accepted
(a request that is not exactly valid is never answered 200); the server answers a normal request afterwards.
A fake engine answers (no model); every socket has a timeout; loopback only."""

import json
import socket
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_slow_clients import _start, tok  # noqa: F401  (tok: the fixture)

GOOD = {"prompt": "Hi", "max_tokens": 2}
METHODS = st.sampled_from(
    ["POST", "post", "Post", "GET", "get", "HEAD", "OPTIONS", "PUT", "DELETE", "PRI", "FOO", "P\x00ST"]
)
TARGETS = st.sampled_from(
    [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/completions?x=1",
        "/health?",
        "/nope",
        "http://127.0.0.1/v1/completions",
        "http://x/v1/completions?y",
        "*",
        "v1/completions",
        "/v1/completions#frag",
        "/" + "a" * 70_000,
        "/health",
        "/v1/models",
    ]
)
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1.1", "HTTP/x", "HTTP/0.9"])
LOOSE = {
    "max_completion_tokens": ["lots", True, 2.5, None, 0, 2],
    "n": [True, 1, 1.0, "1", 2],
    "logprobs": [0, False, None, "no", 1],
    "stream_options": [{"include_usage": "yes"}, {"include_usage": True}, {"include_usage": 1}, {}, []],
    "presence_penalty": [False, 0, 0.0, "0"],
    "top_logprobs": [False, 0, None],
    "stream": [1, "true", False],
}


def _valid(method: str, target: str, version: str, headers: list[tuple[str, str]], body: dict) -> bool:
    """Whether the request is one this server must answer 200 (the rest must be refused)."""
    if method not in ("POST", "GET") or version not in ("HTTP/1.1", "HTTP/1.0"):
        return False
    path = target.replace("http://127.0.0.1", "")
    if method == "GET":
        return path in ("/health", "/v1/models", "/metrics") and not headers
    if path not in ("/v1/completions", "/v1/chat/completions") or path == "/v1/chat/completions":
        return False  # the drawn body is a completions body
    if headers:
        return False
    for k, v in body.items():
        if k == "max_completion_tokens" and not (type(v) is int and 1 <= v <= 400 and body.get("max_tokens", v) == v):
            return False
        if k in ("n",) and not (type(v) in (int, float) and v == 1):
            return False
        if k == "logprobs" and not (v is None or v is False):
            return False
        if k == "stream_options" and not (isinstance(v, dict) and isinstance(v.get("include_usage", False), bool)):
            return False
        if k == "presence_penalty" and not (type(v) in (int, float) and v == 0):
            return False
        if k == "top_logprobs" and not (v is None or type(v) is int and v == 0):
            return False
        if k == "stream" and type(v) is not bool:
            return False
    return True


EXTRA = st.sampled_from(
    ["none", "two_lengths_same", "two_lengths_differ", "te_and_length", "te_alone", "big_header", "many_headers"]
)


def _head_lines(extra: str, n: int) -> tuple[list[tuple[str, str]], bool]:
    """(extra headers, whether Content-Length is left out)"""
    return {
        "none": ([], False),
        "two_lengths_same": ([("Content-Length", str(n))], False),
        "two_lengths_differ": ([("Content-Length", str(n + 1))], False),
        "te_and_length": ([("Transfer-Encoding", "chunked")], False),
        "te_alone": ([("Transfer-Encoding", "chunked")], True),
        "big_header": ([("X-Big", "b" * 100_000)], False),
        "many_headers": ([(f"X-{i}", "v") for i in range(10_000)], False),
    }[extra]


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    method=METHODS,
    target=TARGETS,
    version=VERSIONS,
    extra=EXTRA,
    fields=st.dictionaries(st.sampled_from(sorted(LOOSE)), st.integers(0, 4), max_size=2),
)
def test_every_request_gets_a_whole_answer_and_every_refusal_the_json_error(
    tok, method, target, version, extra, fields
):
    body = {**GOOD, **{k: LOOSE[k][i % len(LOOSE[k])] for k, i in fields.items()}}
    raw = json.dumps(body).encode()
    headers, no_length = _head_lines(extra, len(raw))
    lines = (
        [f"{method} {target} {version}", "Host: x", "Connection: close"]
        + ([] if no_length else [f"Content-Length: {len(raw)}"])
        + [f"{k}: {v}" for k, v in headers]
    )
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (raw if method.upper() != "GET" else b"")
    httpd, srv = _SERVER
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=5) as s:
        try:
            s.sendall(request)
        except OSError:
            pass  # the server may refuse before reading everything
        status, head, answer = _read_to_close(s)
    assert status != 0 and time.perf_counter() - t0 < 5, (lines[0][:80], head[:200])
    ok = _valid(method, target, version, headers if extra != "none" else [], body)
    if ok:
        assert status == 200, (lines[0][:80], extra, body, answer[:200])
    else:
        assert 400 <= status < 600, (lines[0][:80], extra, body, status)
        assert b"application/json" in head, head[:300]
        if method != "HEAD":
            err = json.loads(answer)["error"]
            assert err["code"] == status and err["message"] and err["type"], err


_SERVER = None


def _read_to_close(s: socket.socket) -> tuple[int, bytes, bytes]:
    """(final status, head, body) of the one answer, read until the server closes (every request here says
    Connection: close); interim 100 Continue answers skipped."""
    s.settimeout(5)
    data = b""
    for _ in range(10_000):
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    while data.startswith(b"HTTP/1.1 100"):
        data = data.partition(b"\r\n\r\n")[2]
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return int(head.split()[1]), head, body
    except (IndexError, ValueError):
        return 0, data, b""


def setup_module(module):
    import test_slow_clients

    module._SERVER = _start(test_slow_clients._Tok(), max_connections=64)


def teardown_module(module):
    httpd, _ = module._SERVER
    httpd.shutdown()
    httpd.server_close()


def test_completions_stream_chunks_are_text_completion_and_the_server_still_answers(tok):
    httpd, _ = _SERVER
    body = json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=5) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        s.settimeout(5)
        data = b""
        while b"[DONE]" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    events = [json.loads(line[6:]) for line in data.decode().split("\n") if line.startswith("data: {")]
    assert events and {e["object"] for e in events} == {"text_completion"}
    assert all("text" in e["choices"][0] for e in events) and events[-1]["choices"][0]["finish_reason"]
