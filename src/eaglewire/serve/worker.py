"""The model side of `eaglewire serve`: a request is a Job on a bounded queue, ONE worker thread owns the
engine (it decodes batch 1) and runs the jobs in arrival order, streaming each round's tokens back on the job's
own queue; a full queue is a 503 and a job whose client left is dropped. Metrics counts what the worker and the
HTTP side (eaglewire.serve.server) see, for /metrics. Nothing here knows HTTP."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from eaglewire.serve.chat_requests import (
    BadRequest,
    Histogram,
    check_messages,
    check_params,
    render_chat,
    render_prompt,
)
from eaglewire.serve.spec_metrics import VllmSpecCounters
from eaglewire.tau import acceptance_length


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
    latency: Histogram = field(
        default_factory=lambda: Histogram(
            "eaglewire_request_seconds", "Request received to last byte sent, successful generations"
        )
    )
    first_token: Histogram = field(
        default_factory=lambda: Histogram(
            "eaglewire_time_to_first_token_seconds", "Request received to its first generated token"
        )
    )
    queue_wait: Histogram = field(
        default_factory=lambda: Histogram("eaglewire_queue_wait_seconds", "Request received to the worker starting it")
    )
    spec: VllmSpecCounters = field(default_factory=VllmSpecCounters)  # the same rounds under vLLM's names

    def prometheus(self) -> str:
        tau = (
            acceptance_length(self.accepted, self.verify_steps) if self.verify_steps else 0.0
        )  # a gauge needs a number
        rows = [
            ("eaglewire_requests_total", "counter", self.requests),
            ("eaglewire_generated_tokens_total", "counter", self.tokens),
            ("eaglewire_verify_steps_total", "counter", self.verify_steps),
            ("eaglewire_accepted_draft_tokens_total", "counter", self.accepted),
            ("eaglewire_request_errors_total", "counter", self.errors),
            ("eaglewire_requests_cancelled_total", "counter", self.cancelled),
            ("eaglewire_requests_busy_total", "counter", self.busy),
            ("eaglewire_acceptance_length", "gauge", tau),
        ]
        return (
            "".join(f"# TYPE {n} {t}\n{n} {v}\n" for n, t, v in rows)
            + "".join(h.prometheus() for h in (self.latency, self.first_token, self.queue_wait))
            + self.spec.prometheus()
        )


def finish_reason(tokens: list[int], max_tokens: int, eos: set[int]) -> str:
    """One rule for streamed and unstreamed answers: an end-of-sequence token is "stop", the budget "length"."""
    if tokens and tokens[-1] in eos:
        return "stop"
    return "length" if len(tokens) >= max_tokens else "stop"


class SpecServer:
    """Holds the engine; `generate(job)` runs on the worker thread only."""

    def __init__(
        self,
        generate: Callable[[Job, Callable[[list[int]], None]], Any],
        tokenizer: Any,
        model_name: str,
        max_tokens_limit: int,
        max_context: int,
        max_queue: int = 64,
        eos: set[int] | None = None,
        draft_depth: int = 0,
        about: dict[str, Any] | None = None,
    ) -> None:
        self.generate, self.tok, self.model_name = generate, tokenizer, model_name
        self.about = about or {}  # the numerics answers depend on (dtype, runtime, shape): /v1/models shows them
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
            raise BadRequest(
                404,
                f"model: unknown model {str(body.get('model'))[:80]!r}; this server serves {self.model_name!r}",
                "model_not_found",
                "model",
            )
        p = check_params(body, path, self.max_tokens_limit)
        # one encode at a time: split_special_tokens is a switch on the shared Rust tokenizer, so a concurrent
        # encode of a template part could see it on (a burst once changed greedy answers that way)
        with self.tok_lock:
            if path == "/v1/chat/completions":
                ids = render_chat(self.tok, check_messages(body.get("messages")))
            else:
                ids = render_prompt(self.tok, body.get("prompt"))
        if len(ids) + p.max_tokens > self.max_context:
            raise BadRequest(
                400,
                f"messages: prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) exceeds the "
                f"context of {self.max_context}",
                param="messages",
            )
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
