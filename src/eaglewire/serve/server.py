"""`eaglewire serve`: an OpenAI-compatible server doing speculative decoding on the local target + draft.

    POST /v1/chat/completions   {"model", "messages", "max_tokens", "temperature", "top_p", "seed", "stream"}
    POST /v1/completions        {"model", "prompt", ...}          (raw prompt, no chat template)
    GET  /v1/models, /health, /metrics (Prometheus text)
Acceptance statistics ride along in `usage` (tau, verify_steps, accepted_draft_tokens). One worker thread
owns the model (the engine decodes batch 1); HTTP threads put jobs on a queue and wait, so concurrent
requests are served in arrival order, never dropped. Bad requests get a 4xx OpenAI-style error body.
Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import torch

from eaglewire.contract import acceptance_length


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class Job:
    prompt_ids: torch.Tensor
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stream: bool
    out: "queue.Queue[tuple[str, Any]]" = field(default_factory=queue.Queue)  # ("tokens", [...]) / ("done", stats)


@dataclass
class Metrics:
    requests: int = 0
    tokens: int = 0
    verify_steps: int = 0
    accepted: int = 0
    errors: int = 0

    def prometheus(self) -> str:
        tau = acceptance_length(self.accepted, self.verify_steps) if self.verify_steps else 0.0  # a gauge needs a number
        rows = [("eaglewire_requests_total", "counter", self.requests),
                ("eaglewire_generated_tokens_total", "counter", self.tokens),
                ("eaglewire_verify_steps_total", "counter", self.verify_steps),
                ("eaglewire_accepted_draft_tokens_total", "counter", self.accepted),
                ("eaglewire_request_errors_total", "counter", self.errors),
                ("eaglewire_acceptance_length", "gauge", tau)]
        return "".join(f"# TYPE {n} {t}\n{n} {v}\n" for n, t, v in rows)


class SpecServer:
    """Holds the engine; `generate(job)` runs on the worker thread only."""

    def __init__(self, generate: Callable[[Job, Callable[[list[int]], None]], Any], tokenizer: Any, model_name: str,
                 max_tokens_limit: int, max_context: int, max_queue: int = 64) -> None:
        self.generate, self.tok, self.model_name = generate, tokenizer, model_name
        self.max_tokens_limit, self.max_context = max_tokens_limit, max_context
        self.jobs: "queue.Queue[Job]" = queue.Queue(maxsize=max_queue)
        self.metrics, self.lock = Metrics(), threading.Lock()
        threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                stats = self.generate(job, lambda toks, j=job: j.out.put(("tokens", toks)))
                with self.lock:
                    self.metrics.verify_steps += stats.verify_steps
                    self.metrics.accepted += sum(stats.accepted)
                    self.metrics.tokens += stats.new_tokens
                job.out.put(("done", stats))
            except Exception as err:  # reported to the waiting client as a 500, the worker keeps serving
                job.out.put(("error", f"{type(err).__name__}: {err}"))

    def parse(self, path: str, body: dict) -> Job:
        if body.get("model", self.model_name) != self.model_name:
            raise BadRequest(404, f"unknown model {body.get('model')!r}; this server serves {self.model_name!r}",
                             "model_not_found")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", min(256, self.max_tokens_limit)))
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.max_tokens_limit:
            raise BadRequest(400, f"max_tokens must be an integer in [1, {self.max_tokens_limit}], got {max_tokens!r}")
        temperature, top_p = body.get("temperature", 0.0), body.get("top_p", 1.0)
        if not isinstance(temperature, (int, float)) or temperature < 0 or not isinstance(top_p, (int, float)) \
                or not 0 < top_p <= 1:
            raise BadRequest(400, "temperature must be >= 0 and top_p in (0, 1]")
        if path == "/v1/chat/completions":
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m and
                                                                 isinstance(m.get("content"), str) for m in msgs):
                raise BadRequest(400, "messages must be a non-empty list of {role, content} objects")
            ids = self.tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True,
                                               return_tensors="pt")["input_ids"]
        else:
            if not isinstance(body.get("prompt"), str) or not body["prompt"]:
                raise BadRequest(400, "prompt must be a non-empty string")
            ids = self.tok(body["prompt"], return_tensors="pt")["input_ids"]
        if ids.shape[1] + max_tokens > self.max_context:
            raise BadRequest(400, f"prompt ({ids.shape[1]} tokens) + max_tokens ({max_tokens}) exceeds the "
                             f"context of {self.max_context}")
        return Job(ids, max_tokens, float(temperature), float(top_p), int(body.get("seed", 0)), bool(body.get("stream")))

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise BadRequest(503, "server queue is full; retry later", "server_busy") from None
        with self.lock:
            self.metrics.requests += 1


def _usage(job: Job, stats: Any) -> dict:
    return {"prompt_tokens": int(job.prompt_ids.shape[1]), "completion_tokens": stats.new_tokens,
            "total_tokens": int(job.prompt_ids.shape[1]) + stats.new_tokens, "verify_steps": stats.verify_steps,
            "accepted_draft_tokens": sum(stats.accepted), "tau": stats.tau if stats.accepted else None}


def make_handler(srv: SpecServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet; /metrics is the record
            pass

        def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
            data = (json.dumps(body) if ctype == "application/json" else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, err: BadRequest) -> None:
            with srv.lock:
                srv.metrics.errors += 1
            self._send(err.status, {"error": {"message": err.message, "type": err.kind, "code": err.status}})

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/metrics":
                self._send(200, srv.metrics.prometheus(), "text/plain; version=0.0.4")
            elif self.path == "/health":
                self._send(200, {"status": "ok", "queued": srv.jobs.qsize()})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": srv.model_name, "object": "model"}]})
            else:
                self._error(BadRequest(404, f"no route {self.path}", "not_found"))

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self._error(BadRequest(404, f"no route {self.path}", "not_found"))
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise BadRequest(400, "request body is not valid JSON") from None
                if not isinstance(body, dict):
                    raise BadRequest(400, "request body must be a JSON object")
                job = srv.parse(self.path, body)
                srv.submit(job)
            except BadRequest as err:
                return self._error(err)
            (self._stream if job.stream else self._complete)(job)

        def _wait(self, job: Job):
            while True:
                kind, payload = job.out.get()
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
                    text = srv.tok.decode(toks, skip_special_tokens=True)
                    chat = self.path == "/v1/chat/completions"
                    finish = "length" if len(toks) >= job.max_tokens else "stop"
                    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                              if chat else {"index": 0, "text": text, "finish_reason": finish})
                    self._send(200, {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion" if chat
                                     else "text_completion", "created": int(time.time()), "model": srv.model_name,
                                     "choices": [choice], "usage": _usage(job, payload)})

        def _stream(self, job: Job) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            cid, chat, sent = f"chatcmpl-{uuid.uuid4().hex[:12]}", self.path == "/v1/chat/completions", []
            for kind, payload in self._wait(job):
                if kind == "tokens":
                    before = srv.tok.decode(sent, skip_special_tokens=True)
                    sent += payload
                    delta = srv.tok.decode(sent, skip_special_tokens=True)[len(before):]
                    chunk = {"index": 0, "delta": {"content": delta}} if chat else {"index": 0, "text": delta}
                    self._event({"id": cid, "object": "chat.completion.chunk", "model": srv.model_name,
                                 "choices": [chunk]})
                elif kind == "done":
                    self._event({"id": cid, "object": "chat.completion.chunk", "model": srv.model_name,
                                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                 "usage": _usage(job, payload)})
                else:
                    self._event({"error": {"message": payload, "type": "server_error"}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _event(self, obj: dict) -> None:
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

    return Handler


def serve(srv: SpecServer, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """Create the HTTP server (call .serve_forever(); .server_address has the bound port)."""
    return ThreadingHTTPServer((host, port), make_handler(srv))


def build_server(target: Any, draft: Any, shape: Any, model_name: str | None, max_context: int,
                 max_tokens_limit: int, host: str, port: int,
                 log: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """The `eaglewire serve` server: a loaded draft (in the target's dtype) on the target's runtime, bound to
    host:port. `log` hears what the start does (GEMM layout calibration measured, or reused from the cache)."""
    from eaglewire.decoding.engine import SpecDecoder
    from eaglewire.serve.runtimes import make_proposer, make_runtime

    rt = make_runtime(target, max_context + shape.num_draft_tokens + 8, calibrate=True, log=log,
                      verify_rows=(shape.num_draft_tokens,))
    decoder = SpecDecoder(rt, make_proposer(draft, draft.contract, shape, max_context, rt))
    eos = {target.tokenizer.eos_token_id}

    def generate(job: Job, on_tokens: Callable[[list[int]], None]) -> Any:  # on the server's single worker thread
        _, stats = decoder.generate(job.prompt_ids, job.max_tokens, eos, temperature=job.temperature,
                                    top_p=job.top_p, seed=job.seed, on_tokens=on_tokens)
        return stats

    srv = SpecServer(generate, target.tokenizer, model_name or target.name, max_tokens_limit, max_context)
    return serve(srv, host, port)
