"""`eaglewire serve`: an OpenAI-compatible server doing speculative decoding on the local target + draft.

    POST /v1/chat/completions   {"model", "messages", "max_tokens", "temperature", "top_p", "seed", "stream"}
    POST /v1/completions        {"model", "prompt", ...}          (raw prompt, no chat template)
    GET  /v1/models, /health, /metrics (Prometheus text)
Acceptance statistics ride along in `usage` (tau, verify_steps, accepted_draft_tokens). One worker thread
owns the model (the engine decodes batch 1; eaglewire.serve.worker); HTTP threads put jobs on a queue and wait,
so concurrent requests are served in arrival order; a full queue answers 503. Every malformed or unsupported
request gets a 4xx naming the field (eaglewire.serve.chat_requests); a client that disconnects stops its
generation within a verify round. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import io
import json
import queue
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eaglewire.serve.connections import (
    EVICT_AFTER_S,
    MAX_CONNECTION_BYTES,
    MAX_REQUESTS_PER_CONNECTION,
    REQUEST_DEADLINE_S,
    SSE_PROBE,
    ConnectionTable,
    PeerWatch,
    RequestReader,
    refuse_busy,
)
from eaglewire.serve.chat_requests import BadRequest, content_length, parse_body
from eaglewire.serve.worker import Cancelled, Job, Metrics, SpecServer, finish_reason

__all__ = [
    "Cancelled",
    "Handler",
    "Job",
    "Metrics",
    "SpecServer",
    "bind",
    "finish_reason",
    "make_handler",
    "serve",
]  # the model side (Job, SpecServer, Metrics) lives in serve/worker.py; importable from here too

ROUTES = ("/v1/chat/completions", "/v1/completions")
LISTEN_BACKLOG = 256  # socketserver's default of 5 reset connections of a burst before they were accepted
MAX_CONNECTIONS = 512  # open connections (one thread each) beyond which a new one gets a 503 and is closed
READ_TIMEOUT_S = 10.0  # per socket operation (writes, keep-alive reads); a request's reads: REQUEST_DEADLINE_S
POLL_S = 0.05  # how often a waiting request checks that its client is still there


def _usage(job: Job, stats: Any) -> dict:
    return {
        "prompt_tokens": int(job.prompt_ids.shape[1]),
        "completion_tokens": stats.new_tokens,
        "total_tokens": int(job.prompt_ids.shape[1]) + stats.new_tokens,
        "verify_steps": stats.verify_steps,
        "accepted_draft_tokens": sum(stats.accepted),
        "tau": stats.tau if stats.accepted else None,
    }


class Handler(BaseHTTPRequestHandler):
    """The OpenAI-compatible routes over one SpecServer (`srv`, bound by make_handler: http.server builds a
    handler per request from its class)."""

    srv: SpecServer
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_S
    request_deadline_s = REQUEST_DEADLINE_S  # request line + headers + body together (serve/connections.py)

    def log_message(self, *args: Any) -> None:  # quiet; /metrics is the record
        pass

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # socketserver's reader: replaced by one held to each request's deadline
        self.reader = RequestReader(self.connection, getattr(self.server, "table", None), self.timeout)
        self.rfile, self.served = io.BufferedReader(self.reader), 0
        self.watch = PeerWatch(self.connection, interim_ok=False)

    def handle_one_request(self) -> None:
        self.reader.begin(self.request_deadline_s)  # the wait for the next request counts towards it
        try:
            super().handle_one_request()
        finally:
            self.reader.end()
            self.served += 1

    def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if ctype == "application/json" else body).encode()
        if (
            self.served + 1 >= MAX_REQUESTS_PER_CONNECTION
            or self.reader.bytes >= MAX_CONNECTION_BYTES
            or self.watch.half_closed
        ):  # the connection's budget is spent, or it can send nothing more
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer is the head alone
            self.wfile.write(data)

    def _error(self, err: BadRequest) -> None:
        with self.srv.lock:
            self.srv.metrics.errors += 1
        self._send(err.status, err.body())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a request line or header too long, too many headers, a method or an HTTP
        version it does not know, an HTTP/2 preface) as the JSON error every route answers with, not its HTML
        page; the connection closes (what follows on it cannot be trusted to be a request)."""
        from http import HTTPStatus

        if self.request_version not in ("HTTP/1.0", "HTTP/1.1"):  # unparsed: still answer with a status line
            self.request_version = "HTTP/1.1"
        self.close_connection = True
        kinds = {408: "timeout", 413: "request_too_large", 414: "request_too_large", 431: "request_too_large"}
        text = message or HTTPStatus(code).phrase
        self._error(
            BadRequest(
                code, f"{text}{f' ({explain})' if explain else ''}"[:300], kinds.get(code, "invalid_request_error")
            )
        )

    def parse_request(self) -> bool:
        """http.server's parse, with only HTTP/1.0 and 1.1 accepted: it would answer HTTP/0.9 with a bare body
        (no status line) and take HTTP/2's preface for a method."""
        if not super().parse_request():
            return False
        if self.request_version not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(505, f"HTTP version {self.request_version[:20]!r} is not supported; use HTTP/1.1")
            return False
        return True

    def do_HEAD(self) -> None:  # noqa: N802
        self._not_allowed()

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._not_allowed()

    def do_PUT(self) -> None:  # noqa: N802
        self._not_allowed()

    def do_DELETE(self) -> None:  # noqa: N802
        self._not_allowed()

    def _not_allowed(self) -> None:
        self.reader.end()
        self.close_connection = True  # a body it may have sent is not read
        allowed = "POST" if self.path.split("?")[0] in ROUTES else "GET"
        self._error(
            BadRequest(
                405, f"method {self.command} is not allowed on {self.path[:100]}; use {allowed}", "method_not_allowed"
            )
        )

    def _route(self) -> str:
        """The request target's path: an absolute-form target (http://host/path) names its path; a query string
        is refused (no route takes parameters there, and none may be silently ignored)."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.path)
        path = parts.path if parts.scheme in ("http", "https") or self.path.startswith("/") else self.path
        if parts.query or self.path.endswith("?"):
            raise BadRequest(
                400,
                f"the target {self.path[:100]!r} has a query string; this server takes "
                "parameters in the JSON body only",
                param="query",
            )
        return path

    def do_GET(self) -> None:  # noqa: N802
        self.reader.end()
        try:
            route = self._route()
        except BadRequest as err:
            return self._error(err)
        if route == "/metrics":
            with self.srv.lock:
                text = self.srv.metrics.prometheus()
            self._send(200, text, "text/plain; version=0.0.4")
        elif route == "/health":
            self._send(200, {"status": "ok", "queued": self.srv.jobs.qsize()})
        elif route == "/v1/models":
            model = {"id": self.srv.model_name, "object": "model"}
            self._send(
                200, {"object": "list", "data": [{**model, "eaglewire": self.srv.about} if self.srv.about else model]}
            )
        else:
            self._error(BadRequest(404, f"no route {self.path[:100]}", "not_found"))

    def do_POST(self) -> None:  # noqa: N802
        received, body_read = time.perf_counter(), False
        self.watch = PeerWatch(self.connection, interim_ok=self.request_version == "HTTP/1.1")
        try:
            n = content_length(self.headers.get_all("Content-Length"), self.headers.get_all("Transfer-Encoding"))
            raw = self.rfile.read(n)
            self.reader.end()  # read in full (or not): no longer held to the request's deadline
            body_read = len(raw) == n
            if not body_read:
                raise BadRequest(
                    400, f"Content-Length: declared {n} bytes, the body had {len(raw)}", param="Content-Length"
                )
            route = self._route()
            if route not in ROUTES:
                raise BadRequest(404, f"no route {self.path[:100]}", "not_found")
            self.route = route
            job = self.srv.parse(route, parse_body(raw))
            job.received = received
            self.srv.submit(job)
        except BadRequest as err:
            if not body_read:
                self.close_connection = True  # an unread body must not be taken for the next request
            return self._error(err)
        except socket.timeout:
            self.close_connection = True
            return self._error(
                BadRequest(
                    408,
                    f"body: not received within the request's deadline of {self.request_deadline_s:g} s",
                    "timeout",
                    "body",
                )
            )
        try:
            (self._stream if job.stream else self._complete)(job)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            job.cancelled.set()  # the client is gone: the worker stops after this round
            self.close_connection = True
            return
        self.srv.metrics.latency.observe(time.perf_counter() - job.received)

    def _wait(self, job: Job):
        while True:
            try:
                kind, payload = job.out.get(timeout=POLL_S)
            except queue.Empty:
                kind = None
            if self.watch.gone():  # checked between tokens too: a closed stream may still accept writes
                raise ConnectionResetError("client closed the connection")
            if kind is None:
                continue
            yield kind, payload
            if kind in ("done", "error"):
                return

    def _complete(self, job: Job) -> None:
        toks: list[int] = []
        for kind, payload in self._wait(job):
            if kind == "tokens":
                toks += payload
            elif kind == "error":
                return self._error(BadRequest(500, payload, "server_error"))
            else:
                text = self.srv.tok.decode(toks, skip_special_tokens=True)
                chat = self.route == "/v1/chat/completions"
                finish = finish_reason(toks, job.max_tokens, self.srv.eos)
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": finish}
                )
                self._send(
                    200,
                    {
                        "id": f"cmpl-{uuid.uuid4().hex[:12]}",
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": self.srv.model_name,
                        "choices": [choice],
                        "usage": _usage(job, payload),
                    },
                )

    def _stream(self, job: Job) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.watch.answer_started(SSE_PROBE)  # a client that read this head and left is found by the probe
        chat, sent = self.route == "/v1/chat/completions", []
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:12]}"
        label = "chat.completion.chunk" if chat else "text_completion"  # what OpenAI labels each route's chunks
        for kind, payload in self._wait(job):
            if kind == "tokens":
                before = self.srv.tok.decode(sent, skip_special_tokens=True)
                sent += payload
                delta = self.srv.tok.decode(sent, skip_special_tokens=True)[len(before) :]
                chunk = {"index": 0, "delta": {"content": delta}} if chat else {"index": 0, "text": delta}
                self._event({"id": cid, "object": label, "model": self.srv.model_name, "choices": [chunk]})
            elif kind == "done":
                end = finish_reason(sent, job.max_tokens, self.srv.eos)
                last = (
                    {"index": 0, "delta": {}, "finish_reason": end}
                    if chat
                    else {"index": 0, "text": "", "finish_reason": end}
                )
                self._event(
                    {
                        "id": cid,
                        "object": label,
                        "model": self.srv.model_name,
                        "choices": [last],
                        "usage": _usage(job, payload),
                    }
                )
            else:
                self._event({"error": {"message": payload, "type": "server_error"}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _event(self, obj: dict) -> None:
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()


def make_handler(srv: SpecServer) -> type[BaseHTTPRequestHandler]:
    """Handler bound to `srv`."""
    return type("BoundHandler", (Handler,), {"srv": srv})


class _Server(ThreadingHTTPServer):
    """A listen backlog that takes a burst, and a cap on open connections answered with 503 (not a reset)."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    max_connections, evict_after = MAX_CONNECTIONS, EVICT_AFTER_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.open_connections, self.count_lock, self.table = 0, threading.Lock(), ConnectionTable()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.count_lock:  # full: the connection longest in reading one request makes room, if any
            full = self.open_connections >= self.max_connections and not self.table.evict_oldest(self.evict_after)
            if not full:
                self.open_connections += 1
        if full:
            refuse_busy(request)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.table.end(request)
            with self.count_lock:
                self.open_connections -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], OSError):  # a client gone or cut off mid-answer is no server fault
            super().handle_error(request, client_address)


def serve(srv: SpecServer, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """Create the HTTP server (call .serve_forever(); .server_address has the bound port)."""
    return _Server((host, port), make_handler(srv))


def bind(host: str, port: int) -> ThreadingHTTPServer:
    """The listening socket, taken before the model loads (serve/start.py's build_server(..., httpd=) answers on it): a port in
    use or an address this machine does not have is an error at once, not after minutes of loading.
    Connections that arrive while the model loads wait in the listen backlog."""
    from eaglewire.paths import os_error

    try:
        return _Server((host, port), Handler)
    except OSError as err:  # in use, not this machine's address, a privileged port, a name that does not resolve
        raise os_error(err, f"listening on --host {host} --port {port}") from None
