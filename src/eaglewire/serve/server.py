"""`eaglewire serve`: an OpenAI-compatible server doing speculative decoding on the local target + draft.

    POST /v1/chat/completions   {"model", "messages", "max_tokens", "temperature", "top_p", "seed", "stream"}
    POST /v1/completions        {"model", "prompt", ...}          (raw prompt, no chat template)
    GET  /v1/models, /health, /metrics (Prometheus text)
Acceptance statistics ride along in `usage` (tau, verify_steps, accepted_draft_tokens). One worker thread
owns the model (the engine decodes batch 1); HTTP threads put jobs on a queue and wait, so concurrent
requests are served in arrival order; a full queue answers 503. Every malformed or unsupported request gets
a 4xx naming the field (eaglewire.serve.chat_requests); a client that disconnects stops its generation within a
verify round. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import io
import json
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import torch

from eaglewire.tau import acceptance_length
from eaglewire.serve.spec_metrics import VllmSpecCounters
from eaglewire.serve.connections import EVICT_AFTER_S, MAX_CONNECTION_BYTES, MAX_REQUESTS_PER_CONNECTION, \
    REQUEST_DEADLINE_S, ConnectionTable, PeerWatch, RequestReader, refuse_busy
from eaglewire.serve.chat_requests import BadRequest, Histogram, check_messages, check_params, content_length, \
    parse_body, render_chat, render_prompt

ROUTES = ("/v1/chat/completions", "/v1/completions")
LISTEN_BACKLOG = 256  # socketserver's default of 5 reset connections of a burst before they were accepted
MAX_CONNECTIONS = 512  # open connections (one thread each) beyond which a new one gets a 503 and is closed
READ_TIMEOUT_S = 10.0  # per socket operation (writes, keep-alive reads); a request's reads: REQUEST_DEADLINE_S
POLL_S = 0.05  # how often a waiting request checks that its client is still there


class Cancelled(Exception):
    """The client went away: raised from the token callback, so generation stops after the current round."""


@dataclass
class Job:
    prompt_ids: torch.Tensor
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stream: bool
    out: "queue.Queue[tuple[str, Any]]" = field(default_factory=queue.Queue)  # ("tokens", [...]) / ("done", stats)
    cancelled: threading.Event = field(default_factory=threading.Event)
    received: float = field(default_factory=time.perf_counter)  # when the request arrived (set by the handler)
    first_token_seen: bool = False


@dataclass
class Metrics:
    requests: int = 0
    tokens: int = 0
    verify_steps: int = 0
    accepted: int = 0
    errors: int = 0
    cancelled: int = 0
    busy: int = 0
    latency: Histogram = field(default_factory=lambda: Histogram(
        "eaglewire_request_seconds", "Request received to last byte sent, successful generations"))
    first_token: Histogram = field(default_factory=lambda: Histogram(
        "eaglewire_time_to_first_token_seconds", "Request received to its first generated token"))
    queue_wait: Histogram = field(default_factory=lambda: Histogram(
        "eaglewire_queue_wait_seconds", "Request received to the worker starting it"))
    spec: VllmSpecCounters = field(default_factory=VllmSpecCounters)  # the same rounds under vLLM's names

    def prometheus(self) -> str:
        tau = acceptance_length(self.accepted, self.verify_steps) if self.verify_steps else 0.0  # a gauge needs a number
        rows = [("eaglewire_requests_total", "counter", self.requests),
                ("eaglewire_generated_tokens_total", "counter", self.tokens),
                ("eaglewire_verify_steps_total", "counter", self.verify_steps),
                ("eaglewire_accepted_draft_tokens_total", "counter", self.accepted),
                ("eaglewire_request_errors_total", "counter", self.errors),
                ("eaglewire_requests_cancelled_total", "counter", self.cancelled),
                ("eaglewire_requests_busy_total", "counter", self.busy),
                ("eaglewire_acceptance_length", "gauge", tau)]
        return "".join(f"# TYPE {n} {t}\n{n} {v}\n" for n, t, v in rows) + \
            "".join(h.prometheus() for h in (self.latency, self.first_token, self.queue_wait)) + self.spec.prometheus()


def finish_reason(tokens: list[int], max_tokens: int, eos: set[int]) -> str:
    """One rule for streamed and unstreamed answers: an end-of-sequence token is "stop", the budget "length"."""
    if tokens and tokens[-1] in eos:
        return "stop"
    return "length" if len(tokens) >= max_tokens else "stop"


class SpecServer:
    """Holds the engine; `generate(job)` runs on the worker thread only."""

    def __init__(self, generate: Callable[[Job, Callable[[list[int]], None]], Any], tokenizer: Any, model_name: str,
                 max_tokens_limit: int, max_context: int, max_queue: int = 64, eos: set[int] | None = None,
                 draft_depth: int = 0) -> None:
        self.generate, self.tok, self.model_name = generate, tokenizer, model_name
        self.max_tokens_limit, self.max_context = max_tokens_limit, max_context
        self.eos = eos if eos is not None else {tokenizer.eos_token_id}
        self.jobs: "queue.Queue[Job]" = queue.Queue(maxsize=max_queue)
        self.metrics, self.lock, self.tok_lock = Metrics(), threading.Lock(), threading.Lock()
        self.metrics.spec.depth = draft_depth  # draft positions per round: one per-position series each
        threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        while True:
            job = self.jobs.get()
            if job.cancelled.is_set():  # its client left while it waited: nothing to run
                with self.lock:
                    self.metrics.cancelled += 1
                continue
            self.metrics.queue_wait.observe(time.perf_counter() - job.received)
            try:
                stats = self.generate(job, lambda toks, j=job: self._on_tokens(j, toks))
                with self.lock:
                    self.metrics.verify_steps += stats.verify_steps
                    self.metrics.accepted += sum(stats.accepted)
                    self.metrics.spec.count(stats.accepted)
                    self.metrics.tokens += stats.new_tokens
                job.out.put(("done", stats))
            except Cancelled:
                with self.lock:
                    self.metrics.cancelled += 1
            except Exception as err:  # reported to the waiting client as a 500, the worker keeps serving
                job.out.put(("error", f"{type(err).__name__}: {err}"))

    def _on_tokens(self, job: Job, toks: list[int]) -> None:
        if job.cancelled.is_set():
            raise Cancelled
        if not job.first_token_seen:
            job.first_token_seen = True
            self.metrics.first_token.observe(time.perf_counter() - job.received)
        job.out.put(("tokens", toks))

    def parse(self, path: str, body: dict) -> Job:
        if body.get("model", self.model_name) != self.model_name:
            raise BadRequest(404, f"model: unknown model {str(body.get('model'))[:80]!r}; this server serves "
                             f"{self.model_name!r}", "model_not_found", "model")
        p = check_params(body, path, self.max_tokens_limit)
        # one encode at a time: split_special_tokens is a switch on the shared Rust tokenizer, so a concurrent
        # encode of a template part could see it on (a burst once changed greedy answers that way)
        with self.tok_lock:
            if path == "/v1/chat/completions":
                ids = render_chat(self.tok, check_messages(body.get("messages")))
            else:
                ids = render_prompt(self.tok, body.get("prompt"))
        if len(ids) + p.max_tokens > self.max_context:
            raise BadRequest(400, f"messages: prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) exceeds the "
                             f"context of {self.max_context}", param="messages")
        return Job(torch.tensor([ids]), p.max_tokens, p.temperature, p.top_p, p.seed, p.stream)

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            with self.lock:
                self.metrics.busy += 1
            raise BadRequest(503, "server queue is full; retry later", "server_busy") from None
        with self.lock:
            self.metrics.requests += 1


def _usage(job: Job, stats: Any) -> dict:
    return {"prompt_tokens": int(job.prompt_ids.shape[1]), "completion_tokens": stats.new_tokens,
            "total_tokens": int(job.prompt_ids.shape[1]) + stats.new_tokens, "verify_steps": stats.verify_steps,
            "accepted_draft_tokens": sum(stats.accepted), "tau": stats.tau if stats.accepted else None}


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
        if self.served + 1 >= MAX_REQUESTS_PER_CONNECTION or self.reader.bytes >= MAX_CONNECTION_BYTES or \
                self.watch.half_closed:  # the connection's budget is spent, or it can send nothing more
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: BadRequest) -> None:
        with self.srv.lock:
            self.srv.metrics.errors += 1
        self._send(err.status, err.body())

    def do_GET(self) -> None:  # noqa: N802
        self.reader.end()
        if self.path == "/metrics":
            with self.srv.lock:
                text = self.srv.metrics.prometheus()
            self._send(200, text, "text/plain; version=0.0.4")
        elif self.path == "/health":
            self._send(200, {"status": "ok", "queued": self.srv.jobs.qsize()})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.srv.model_name, "object": "model"}]})
        else:
            self._error(BadRequest(404, f"no route {self.path[:100]}", "not_found"))

    def do_POST(self) -> None:  # noqa: N802
        received, body_read = time.perf_counter(), False
        self.watch = PeerWatch(self.connection, interim_ok=self.request_version == "HTTP/1.1")
        try:
            n = content_length(self.headers.get("Content-Length"))
            raw = self.rfile.read(n)
            self.reader.end()  # read in full (or not): no longer held to the request's deadline
            body_read = len(raw) == n
            if not body_read:
                raise BadRequest(400, f"Content-Length: declared {n} bytes, the body had {len(raw)}",
                                 param="Content-Length")
            if self.path not in ROUTES:
                raise BadRequest(404, f"no route {self.path[:100]}", "not_found")
            job = self.srv.parse(self.path, parse_body(raw))
            job.received = received
            self.srv.submit(job)
        except BadRequest as err:
            if not body_read:
                self.close_connection = True  # an unread body must not be taken for the next request
            return self._error(err)
        except socket.timeout:
            self.close_connection = True
            return self._error(BadRequest(408, f"body: not received within the request's deadline of "
                                          f"{self.request_deadline_s:g} s", "timeout", "body"))
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
                chat = self.path == "/v1/chat/completions"
                finish = finish_reason(toks, job.max_tokens, self.srv.eos)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                          if chat else {"index": 0, "text": text, "finish_reason": finish})
                self._send(200, {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion" if chat
                                 else "text_completion", "created": int(time.time()), "model": self.srv.model_name,
                                 "choices": [choice], "usage": _usage(job, payload)})

    def _stream(self, job: Job) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.watch.answer_started()
        cid, chat, sent = f"chatcmpl-{uuid.uuid4().hex[:12]}", self.path == "/v1/chat/completions", []
        for kind, payload in self._wait(job):
            if kind == "tokens":
                before = self.srv.tok.decode(sent, skip_special_tokens=True)
                sent += payload
                delta = self.srv.tok.decode(sent, skip_special_tokens=True)[len(before):]
                chunk = {"index": 0, "delta": {"content": delta}} if chat else {"index": 0, "text": delta}
                self._event({"id": cid, "object": "chat.completion.chunk", "model": self.srv.model_name,
                             "choices": [chunk]})
            elif kind == "done":
                self._event({"id": cid, "object": "chat.completion.chunk", "model": self.srv.model_name,
                             "choices": [{"index": 0, "delta": {},
                                          "finish_reason": finish_reason(sent, job.max_tokens, self.srv.eos)}],
                             "usage": _usage(job, payload)})
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


def build_server(target: Any, draft: Any, shape: Any, model_name: str | None, max_context: int,
                 max_tokens_limit: int, host: str, port: int,
                 log: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """The `eaglewire serve` server: a loaded draft (in the target's dtype) on the target's runtime, bound to
    host:port. `log` hears what the start does (GEMM layout calibration measured, or reused from the cache)."""
    from eaglewire.compose import cache_len, proposer, runtime
    from eaglewire.decoding.engine import SpecDecoder

    say = log or (lambda _m: None)
    t0 = time.perf_counter()
    say(f"building the target runtime (context {max_context} + {shape.num_draft_tokens} draft tokens)")
    max_len = cache_len(max_context, shape)
    rt = runtime(target, max_len, calibrate=True, log=log, verify_rows=(shape.num_draft_tokens,))
    say(f"target runtime ready in {time.perf_counter() - t0:.1f} s; building the decoder")
    t1 = time.perf_counter()
    decoder = SpecDecoder(rt, proposer(draft, shape, max_len, rt))
    eos = {target.tokenizer.eos_token_id}
    say(f"decoder ready in {time.perf_counter() - t1:.1f} s; binding {host}:{port}")

    def generate(job: Job, on_tokens: Callable[[list[int]], None]) -> Any:  # on the server's single worker thread
        _, stats = decoder.generate(job.prompt_ids, job.max_tokens, eos, temperature=job.temperature,
                                    top_p=job.top_p, seed=job.seed, on_tokens=on_tokens)
        return stats

    srv = SpecServer(generate, target.tokenizer, model_name or target.name, max_tokens_limit, max_context, eos=eos,
                     draft_depth=shape.num_steps)
    httpd = serve(srv, host, port)
    say(f"listening on {host}:{httpd.server_address[1]} (backlog {LISTEN_BACKLOG}, queue {srv.jobs.maxsize}); "
        f"start took {time.perf_counter() - t0:.1f} s")
    return httpd
