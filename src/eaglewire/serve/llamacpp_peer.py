"""llama.cpp's llama-server as peer rows of `eaglewire bench --llamacpp`: llama.cpp alone and llama.cpp with our
EAGLE-3 draft as a GGUF, on the same prompts (the exact token ids), greedy, one request at a time, beside our own
rows. The target GGUF's precision (the shipped Q4_1, or f32 converted from the float target) and the draft GGUF's
(f32, f16, q8_0) are options; the chain length is the bench's k (--spec-draft-n-max).

The rows take turns, never run together: each server is started and warmed up (a request not counted), then
paused (SIGSTOP) and resumed only for its own requests, as vLLM's peer rows are (serve/peer.py) — llama.cpp's
threads spin while they wait, so a running idle server would slow whatever runs beside it. tok/s is the generated
tokens over the request's wall time seen by the client; tau and per-position acceptance are llama-server's own
counters (/metrics) over the measured requests; `matches_llamacpp_vanilla` counts the draft row's answers equal
to llama.cpp's own plain answers (its losslessness: at Q4_1 llama.cpp's greedy text is not our f32 one).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglewire.errors import EaglewireError
from eaglewire.families import get_family
from eaglewire.target.protocol import RunnableTarget

LLAMACPP_METHODS = ("llamacpp_vanilla", "llamacpp_eagle_chain")
TARGET_PRECISIONS, DRAFT_PRECISIONS = ("q4_1", "f32"), ("f32", "f16", "bf16", "q8_0", "q4_0")


def draft_gguf(
    target: RunnableTarget, draft: Any, out: Path, precision: str = "f32", vocab_from: Path | None = None
) -> Path:
    """Our EAGLE-3 draft as a GGUF llama-server loads (`export --format llamacpp`), carrying the vocabulary of the
    target GGUF it will be served with (`vocab_from`; llama-server refuses a draft whose vocabulary differs)."""
    from eaglewire.export.convert import export_draft

    return (
        export_draft(
            draft,
            draft.contract,
            out.parent / "llamacpp-export",
            "llamacpp",
            gguf_dtype=precision,
            vocab_from=vocab_from,
        )
        / "draft.gguf"
    )


def _target_gguf(target: RunnableTarget, precision: str, tmp: Path) -> Path:
    from eaglewire.serve.llamacpp import convert_hf, target_gguf
    from eaglewire.target.embedded import embedded_key

    if (key := embedded_key(target.path)) is not None:
        return target_gguf(precision, key)
    if precision == "q4_1":
        raise EaglewireError(
            "only the embedded target ships a Q4_1 GGUF",
            expected="--llamacpp-target f32 for another target",
            found=f"target {target.name!r} with q4_1",
        )
    return convert_hf(Path(target.path), tmp / "target.gguf", precision)


class LlamacppPeers:
    """The llama.cpp rows' servers, all up and paused (module docstring)."""

    def __init__(
        self,
        target: RunnableTarget,
        draft: Any,
        prompts: list[torch.Tensor],
        max_new: int,
        k: int,
        names: Sequence[str],
        log: Callable[[str], None] = print,
        target_precision: str = "q4_1",
        draft_precision: str = "f32",
        threads: int | None = None,
    ) -> None:
        unknown = [n for n in names if n not in LLAMACPP_METHODS]
        if unknown:
            raise ValueError(f"unknown llama.cpp rows {unknown}: expected some of {LLAMACPP_METHODS}")
        if target_precision not in TARGET_PRECISIONS or draft_precision not in DRAFT_PRECISIONS:
            raise EaglewireError(
                "unknown GGUF precision",
                expected=f"target {TARGET_PRECISIONS}, draft {DRAFT_PRECISIONS}",
                found=f"target {target_precision}, draft {draft_precision}",
            )
        self.target, self.draft, self.max_new, self.k, self.names = target, draft, max_new, k, list(names)
        self.precision = (target_precision, draft_precision)
        self.spec_type = get_family(draft.contract.family).llamacpp_spec_type
        self.threads = threads or torch.get_num_threads()  # as many as our rows use
        self.warmup = prompts[0][0].tolist()
        self.ctx = max(p.shape[1] for p in prompts) + max_new + k + 16
        self.log, self.eos = log, target.tokenizer.eos_token_id
        self.servers: dict[str, Any] = {}
        self.before: dict[str, Any] = {}  # counters after the warm-up, per draft row
        self.answers: dict[str, list[list[int]]] = {n: [] for n in self.names}
        self._stack = ExitStack()

    def __enter__(self) -> "LlamacppPeers":
        from eaglewire.serve.llamacpp import LlamaServer

        with self._stack as stack:  # on a failed start, everything started so far is stopped
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eaglewire-llamacpp-")))
            model = _target_gguf(self.target, self.precision[0], tmp)
            for name in self.names:
                dgguf = (
                    draft_gguf(self.target, self.draft, tmp / "draft.gguf", self.precision[1], vocab_from=model)
                    if name == "llamacpp_eagle_chain"
                    else None
                )
                self.log(
                    f"{name}: starting llama-server ({self.precision[0]} target"
                    + (f", {self.precision[1]} EAGLE-3 draft, k={self.k}" if dgguf else ", no draft")
                    + f", {self.threads} threads); paused between its requests"
                )
                srv = stack.enter_context(
                    LlamaServer(
                        model, dgguf, spec_type=self.spec_type, n_max=self.k, ctx=self.ctx, threads=self.threads
                    )
                )
                srv.complete(self.warmup, min(16, self.max_new))  # not counted
                if dgguf:
                    self.before[name] = srv.counters()
                _signal(srv, signal.SIGSTOP)
                self.servers[name] = srv
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        for srv in self.servers.values():
            _signal(srv, signal.SIGCONT)  # a stopped process would hold the SIGTERM of its stop()
        self._stack.close()

    def method(self, name: str) -> Callable[[torch.Tensor, int], tuple[list[int], float]]:
        """A bench method on row `name`: (prompt [1, P], max_new) -> (tokens, seconds of the request)."""
        srv = self.servers[name]

        def run(ids: torch.Tensor, max_new: int) -> tuple[list[int], float]:
            _signal(srv, signal.SIGCONT)
            try:
                t0 = time.perf_counter()
                toks = srv.complete(ids[0].tolist(), max_new).tokens
                seconds = time.perf_counter() - t0
            finally:
                _signal(srv, signal.SIGSTOP)
            toks = toks[: toks.index(self.eos) + 1] if self.eos in toks else toks
            self.answers[name].append(toks)
            return toks, seconds

        return run

    def acceptance(self, name: str) -> dict[str, Any]:
        """{"tau", "per_position", "matches_llamacpp_vanilla"} of row `name`'s measured requests; {} for vanilla."""
        if name not in self.before:
            return {}
        srv = self.servers[name]
        _signal(srv, signal.SIGCONT)
        try:
            window = srv.counters().minus(self.before[name])
        finally:
            _signal(srv, signal.SIGSTOP)
        if not window.drafts:
            raise EaglewireError(
                "llama.cpp ran no speculative steps",
                expected="spec_decode_num_drafts to grow",
                found=str(window.to_dict()),
                fix=f"read the server log {srv.log_path}",
            )
        out: dict[str, Any] = {
            "tau": window.tau,
            "per_position": window.per_position,
            "gguf": {"target": self.precision[0], "draft": self.precision[1]},
        }
        plain = self.answers.get("llamacpp_vanilla")
        if plain:
            out["matches_llamacpp_vanilla"] = sum(a == b for a, b in zip(self.answers[name], plain))
        return out


def _signal(srv: Any, sig: int) -> None:
    """SIGSTOP returns once every thread is stopped (delivery is asynchronous: serve/peer.py's note)."""
    from eaglewire.vllm_client.process import PAUSE_TIMEOUT, _wait_group_stopped

    if srv.proc is not None and srv.proc.poll() is None:
        os.killpg(srv.proc.pid, sig)  # its own session: the group is the server
        if sig == signal.SIGSTOP:
            _wait_group_stopped(srv.proc.pid, PAUSE_TIMEOUT)
