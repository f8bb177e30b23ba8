"""The server against slow, half-closing and greedy connections (serve/connections.py): a request must arrive
whole within its deadline (not per read), clients trickling bytes beyond the connection cap do not lock out a
client sending whole requests, a half-closed client is answered, a closed one is cancelled, and a connection's
budget of requests closes it. A fake engine answers (no model): seconds in all. Loopback, ports 18500-18599,
every loop bounded."""

import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglewire.serve import server as server_mod
from eaglewire.serve.server import Handler, SpecServer, _Server

PORTS = range(18500, 18600)


class _Stats:
    def __init__(self, n: int) -> None:
        self.verify_steps, self.accepted, self.new_tokens, self.tau = n, [0] * n, n, 1.0


def _generate(job, on_tokens):
    """One token per 20 ms round, up to max_tokens; raises Cancelled (from on_tokens) when the client left."""
    for _ in range(job.max_tokens):
        on_tokens([42])
        time.sleep(0.02)
    return _Stats(job.max_tokens)


class _Tok:
    """The tokenizer surface the server uses for /v1/completions (a byte per token)."""

    eos_token_id = 0

    def __call__(self, text, split_special_tokens=True):
        return {"input_ids": list(text.encode())}

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i).decode(errors="replace")


@pytest.fixture(scope="module")
def tok():
    return _Tok()


def _start(tok, deadline: float = 1.0, max_connections: int = 8):
    srv = SpecServer(_generate, tok, "tiny", max_tokens_limit=400, max_context=512)
    handler = type("H", (Handler,), {"srv": srv, "request_deadline_s": deadline})
    for port in PORTS:  # the first free port of this test's range
        try:
            httpd = _Server(("127.0.0.1", port), handler)
            break
        except OSError:
            continue
    else:
        pytest.skip("no free port in 18500-18599")
    httpd.max_connections = max_connections
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, srv


def _request(max_tokens: int = 2, keep_alive: bool = False) -> bytes:
    body = json.dumps({"prompt": "Hello", "max_tokens": max_tokens}).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode() + body


def _read_answer(s: socket.socket, limit_s: float = 10.0) -> tuple[int, bytes, bytes]:
    """(final status, headers, body) of one answer; interim 1xx answers skipped."""
    s.settimeout(limit_s)
    data = b""
    for _ in range(10_000):
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep and head.startswith(b"HTTP/1.1 1"):  # an interim answer: skip it
            data = rest
            continue
        if sep:
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            if len(rest) >= length:
                return int(head.split()[1]), head, rest[:length]
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return 0, data, b""


def test_a_trickled_request_is_closed_at_its_deadline_not_per_read(tok):
    httpd, _ = _start(tok, deadline=1.0)
    try:
        body_start = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        for prefix in (b"", body_start):  # trickling the headers, then trickling the body
            port = httpd.server_address[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                t0, closed = time.perf_counter(), False
                s.sendall(prefix)
                for _ in range(40):  # a byte every 0.1 s: each read is quick, the request never completes
                    try:
                        s.sendall(b"x" if not prefix else b" ")
                    except OSError:
                        closed = True
                        break
                    time.sleep(0.1)
                    if _readable_closed(s):
                        closed = True
                        break
                took = time.perf_counter() - t0
                assert closed and 0.8 < took < 2.5, ("a trickling client held its connection", took)
    finally:
        httpd.shutdown()
        httpd.server_close()


def _readable_closed(s: socket.socket) -> bool:
    """The server answered (a 408) or closed: readable."""
    import select

    return bool(select.select([s], [], [], 0)[0])


def test_slow_clients_beyond_the_cap_do_not_lock_out_a_normal_client(tok):
    httpd, srv = _start(tok, deadline=30.0, max_connections=8)
    port, stop, slow_opened, answers = httpd.server_address[1], threading.Event(), [0], []

    def trickle():  # keeps 16 connections (twice the cap) sending a header byte every 0.2 s, reopening closed ones
        socks: list[socket.socket] = []
        for _ in range(200):
            if stop.is_set():
                break
            while len(socks) < 16:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                socks[-1].sendall(b"POST /v1/completions HTTP/1.1\r\n")
                slow_opened[0] += 1
            for s in list(socks):
                try:
                    s.sendall(b"X")
                    if _readable_closed(s):
                        answers.append(s.recv(4096)[:12])
                        raise OSError
                except OSError:
                    socks.remove(s)
                    s.close()
            time.sleep(0.2)
        for s in socks:
            s.close()

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(1.5)  # the slow clients fill the server (and reconnect when refused or closed)
        answered = []
        for _ in range(5):
            t0 = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(_request())
                status, _, body = _read_answer(s)
            answered.append((status, time.perf_counter() - t0))
        assert [a[0] for a in answered] == [200] * 5, answered
        assert max(a[1] for a in answered) < 3.0, answered
        assert slow_opened[0] > 16  # slow connections were closed to make room (and reopened)
        assert b"HTTP/1.1 408" in answers, answers[:5]  # told why, not reset
    finally:
        stop.set()
        t.join(timeout=10)
        httpd.shutdown()
        httpd.server_close()


def test_a_half_closed_client_is_answered_and_a_closed_one_cancelled(tok):
    httpd, srv = _start(tok)
    port = httpd.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(_request(max_tokens=5))
            s.shutdown(socket.SHUT_WR)  # nothing more to send: it waits for the answer
            status, _, body = _read_answer(s)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 5
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(_request(max_tokens=300))  # 6 s of rounds
        time.sleep(0.1)
        s.close()
        t0 = time.perf_counter()
        while srv.metrics.cancelled == 0:
            assert time.perf_counter() - t0 < 3, "the closed client's generation ran on"
            time.sleep(0.02)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_connection_is_closed_when_its_request_budget_is_spent(tok, monkeypatch):
    monkeypatch.setattr(server_mod, "MAX_REQUESTS_PER_CONNECTION", 3)
    httpd, _ = _start(tok)
    try:
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=5) as s:
            heads = []
            for _ in range(3):
                s.sendall(_request(keep_alive=True))
                status, head, _ = _read_answer(s)
                assert status == 200
                heads.append(head)
            assert b"Connection: close" not in heads[1] and b"Connection: close" in heads[2]
            s.settimeout(5)
            assert s.recv(1) == b""  # closed by the server
    finally:
        httpd.shutdown()
        httpd.server_close()


LEAVES = ("fin_after_head", "fin_at_once", "reset", "half_close_and_wait")


def _leave(s: socket.socket, how: str, stream: bool) -> None:
    """A queued client leaving (or half-closing and waiting) one of the ways a client can."""
    import struct

    if how == "fin_after_head" and stream:  # a stream's head comes at once: read it, then close normally
        s.settimeout(5)
        head = b""
        for _ in range(100):
            if b"\r\n\r\n" in head:
                break
            head += s.recv(4096)
        assert b" 200 " in head.split(b"\r\n")[0], head[:80]
    if how == "reset":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if how == "half_close_and_wait":
        s.shutdown(socket.SHUT_WR)
    else:
        s.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.sampled_from(LEAVES), st.booleans(), st.sampled_from(["1.1", "1.0"])), min_size=1, max_size=6)
)
def test_a_queued_client_that_left_is_found_gone_while_its_job_waits(tok, clients):
    """Behind a running job, queued clients leave by FIN (after reading a stream's head, or at once) or by a
    reset: each job is marked cancelled while the first still runs (found gone in the queue, not when its turn
    comes); a client that half-closed and waits (HTTP/1.1, or a stream) gets its whole answer."""
    httpd, srv = _start(tok)
    port, jobs, submit = httpd.server_address[1], [], srv.submit
    srv.submit = lambda job: (jobs.append(job), submit(job))[1]
    waiting = []
    try:
        blocker = socket.create_connection(("127.0.0.1", port), timeout=5)
        blocker.sendall(_request(max_tokens=75))  # 1.5 s of rounds: every other job waits in the queue
        _wait_for(lambda: len(jobs) == 1)
        for i, (how, stream, version) in enumerate(clients):
            if how == "half_close_and_wait" and version == "1.0" and not stream:
                how = "fin_at_once"  # no harmless probe exists there: a half-close is taken as gone (PeerWatch)
            body = json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": stream}).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(
                f"POST /v1/completions HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            )
            _wait_for(lambda: len(jobs) == i + 2)
            _leave(s, how, stream)
            waiting.append((how, stream, s, jobs[-1]))
        t0 = time.perf_counter()
        _wait_for(lambda: all(j.cancelled.is_set() for how, _, _, j in waiting if how != "half_close_and_wait"))
        assert time.perf_counter() - t0 < 1.0, "a gone client's job was not found gone while it waited"
        for how, stream, s, job in waiting:
            if how == "half_close_and_wait":
                data = _read_all(s)
                assert not job.cancelled.is_set() and (b"[DONE]" in data if stream else b'"length"' in data), data
        _read_answer(blocker)
        blocker.close()
    finally:
        for *_, s, _ in waiting:
            s.close()
        httpd.shutdown()
        httpd.server_close()


def _wait_for(cond, limit_s: float = 5.0) -> None:
    t0 = time.perf_counter()
    while not cond():
        assert time.perf_counter() - t0 < limit_s, "timed out"
        time.sleep(0.01)


def _read_all(s: socket.socket, limit_s: float = 10.0) -> bytes:
    s.settimeout(limit_s)
    data = b""
    for _ in range(10_000):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_after_many_clients_left_a_queued_stream_the_next_request_is_answered_at_once(tok):
    """The regression: 40 streaming clients read the head and close normally while a job runs; the next normal
    request is answered within a second of the running job's end (their jobs are not run)."""
    httpd, srv = _start(tok, max_connections=64)
    port = httpd.server_address[1]
    try:
        blocker = socket.create_connection(("127.0.0.1", port), timeout=5)
        blocker.sendall(_request(max_tokens=50))  # 1 s
        body = json.dumps({"prompt": "Hi", "max_tokens": 50, "stream": True}).encode()
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
                _leave(s, "fin_after_head", True)
        _read_answer(blocker)
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(_request(max_tokens=2))
            status, _, _ = _read_answer(s)
        assert status == 200 and time.perf_counter() - t0 < 1.0, time.perf_counter() - t0
    finally:
        httpd.shutdown()
        httpd.server_close()


@settings(max_examples=20, deadline=None)
@given(
    host=st.sampled_from(
        ["127.0.0.1", "0.0.0.0", "localhost", "256.1.1.1", "no-such-host.invalid", "10.255.255.1", "::1"]
    ),
    busy=st.booleans(),
)
def test_serve_takes_its_port_before_loading_and_names_any_fault(host, busy):
    """`serve` binds before the model loads (cli.decoding: bind, then _load): a port in use, an address not this
    machine's or a name that does not resolve is an EaglewireError at once; otherwise the port is held."""
    from typer.testing import CliRunner

    from eaglewire.cli import decoding
    from eaglewire.cli.app import app
    from eaglewire.errors import EaglewireError

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    if busy:
        holder.listen()
    else:
        holder.close()
    loaded = []
    real = decoding._load
    decoding._load = lambda *a, **k: (loaded.append(1), (_ for _ in ()).throw(EaglewireError("stop here")))[1]
    try:
        result = CliRunner().invoke(app, ["serve", "--host", host, "--port", str(port)])
    finally:
        decoding._load = real
        holder.close()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    if loaded:  # bound: the model would load next
        assert "stop here" in result.output
    else:
        assert "listening on" in result.output and "fix:" in result.output, result.output
        assert not (busy and host in ("127.0.0.1", "localhost")) or "already in use" in result.output
