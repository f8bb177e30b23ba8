"""The start of `eaglewire serve`: the target's runtime and the speculative decoder built for a loaded draft,
the worker that owns them, and the HTTP server (serve/server.py) answering on host:port or on a socket `bind`
took before the model loaded. Every step says what it does and how long it took."""

from __future__ import annotations

import time
from http.server import ThreadingHTTPServer
from typing import Any, Callable

from eaglewire.serve.server import LISTEN_BACKLOG, make_handler, serve
from eaglewire.serve.worker import Job, SpecServer
from eaglewire.target.protocol import RunnableTarget


def build_server(
    target: RunnableTarget,
    draft: Any,
    shape: Any,
    model_name: str | None,
    max_context: int,
    max_tokens_limit: int,
    host: str,
    port: int,
    log: Callable[[str], None] | None = None,
    httpd: ThreadingHTTPServer | None = None,
) -> ThreadingHTTPServer:
    """The `eaglewire serve` server: a loaded draft (in the target's dtype) on the target's runtime, bound to
    host:port (or on `httpd`, from `bind`, taken before loading). `log` hears what the start does (GEMM layout
    calibration measured, or reused from the cache)."""
    from eaglewire.compose import proposer
    from eaglewire.decoding.engine import SpecDecoder

    say = log or (lambda _m: None)
    t0 = time.perf_counter()
    rt, max_len = _runtime(target, shape, max_context, log)
    say(f"target runtime ready in {time.perf_counter() - t0:.1f} s; building the decoder")
    t1 = time.perf_counter()
    decoder = SpecDecoder(rt, proposer(draft, shape, max_len, rt))
    eos = {target.tokenizer.eos_token_id}
    say(f"decoder ready in {time.perf_counter() - t1:.1f} s; binding {host}:{port}")

    def generate(job: Job, on_tokens: Callable[[list[int]], None]) -> Any:  # on the server's single worker thread
        _, stats = decoder.generate(
            job.prompt_ids,
            job.max_tokens,
            eos,
            temperature=job.temperature,
            top_p=job.top_p,
            seed=job.seed,
            on_tokens=on_tokens,
        )
        return stats

    srv = SpecServer(
        generate,
        target.tokenizer,
        model_name or target.name,
        max_tokens_limit,
        max_context,
        eos=eos,
        draft_depth=shape.num_steps,
        about=_about(target, rt, shape),
    )
    if httpd is None:
        httpd = serve(srv, host, port)
    else:
        httpd.RequestHandlerClass = make_handler(srv)
    say(
        f"listening on {host}:{httpd.server_address[1]} (backlog {LISTEN_BACKLOG}, queue {srv.jobs.maxsize}); "
        f"start took {time.perf_counter() - t0:.1f} s"
    )
    return httpd


def _runtime(
    target: RunnableTarget, shape: Any, max_context: int, log: Callable[[str], None] | None
) -> tuple[Any, int]:
    """The target's runtime with room for max_context + the shape's draft tokens (its GEMM layouts calibrated,
    or reused from the cache), and that cache length."""
    from eaglewire.compose import FIRST_START_NOTE, cache_len, first_start_builds, runtime

    say = log or (lambda _m: None)
    max_len = cache_len(max_context, shape)
    if first_start_builds(target, max_len):  # said before the minutes start, not after
        say(FIRST_START_NOTE)
    say(f"building the target runtime (context {max_context} + {shape.num_draft_tokens} draft tokens)")
    return runtime(target, max_len, calibrate=True, log=log, verify_rows=(shape.num_draft_tokens,)), max_len


def _about(target: RunnableTarget, rt: Any, shape: Any) -> dict[str, str]:
    """What the server says about its decoding (/health): dtype, runtime, the draft shape."""
    return {
        "dtype": str(target.dtype).removeprefix("torch."),
        "runtime": type(rt).__name__,
        "shape": f"S{shape.num_steps} K{shape.topk} N{shape.num_draft_tokens}",
    }
