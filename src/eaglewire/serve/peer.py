"""vLLM's CPU build as peer rows of `eaglewire bench`: the same draft (exported for vLLM), prompts (the
exact token ids), knobs (greedy, k) and dtype, one request at a time (single stream).

Each row is one vLLM server (vanilla, or EAGLE-3 with `num_speculative_tokens` k), started and warmed up
(a request not counted) before any timing, then **paused** (SIGSTOP to its process group) and resumed only
for its own requests; every server is stopped at the end. So the peer rows run interleaved with ours,
prompt by prompt, like our methods among themselves: a running vLLM engine core spins on the CPU and would
slow whatever runs beside it, but a paused one uses none, and this kind of host drifts by 10-20% within
minutes, which made the earlier design (every peer row first, then ours) compare different minutes of the
machine. tok/s is the generated tokens over the request's wall time seen by the client (HTTP on
127.0.0.1 adds well under a millisecond per request); tau and per-position acceptance are vLLM's own
counters (/metrics), counted over the measured requests.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglewire.tau import acceptance_length
from eaglewire.errors import EaglewireError
from eaglewire.target.protocol import RunnableTarget

PEER_METHODS = ("vllm_vanilla", "vllm_eagle_chain")


def _counts(m: dict[str, Any]) -> tuple[float, float, list[float]]:
    """(drafts, accepted, accepted per position) as raw counts from spec_metrics' normalised figures."""
    drafts = m.get("num_drafts", 0.0)
    per = m["per_position"] if isinstance(m["per_position"], list) else []
    return drafts, m.get("num_accepted_tokens", 0.0), [p * drafts for p in per]


def acceptance_between(before: dict[str, Any], after: dict[str, Any], k: int) -> tuple[float, list[float]]:
    """tau and per-position acceptance of the requests between two readings of vLLM's counters."""
    d0, a0, p0 = _counts(before)
    d1, a1, p1 = _counts(after)
    drafts = d1 - d0
    if drafts <= 0:
        raise EaglewireError(
            "vLLM ran no speculative steps",
            expected="spec_decode_num_drafts to grow",
            found=f"{d0} -> {d1}",
            fix="check the server log: the draft may not have loaded",
        )
    p0 = p0 + [0.0] * (k - len(p0))
    return acceptance_length(a1 - a0, drafts), [(b - a) / drafts for a, b in zip(p0, p1)]


def _with_eos(tokens: list[int], eos: int, max_new: int) -> list[int]:
    """Our loops keep the EOS they stop at; vLLM may leave it out of token_ids."""
    if eos in tokens:
        return tokens[: tokens.index(eos) + 1]
    return tokens + [eos] if len(tokens) < max_new else tokens


class PeerServers:
    """The peer rows' servers, all up and paused (module docstring): `method(name)` runs one prompt on a row,
    `acceptance(name)` reads vLLM's counters over the row's measured requests so far."""

    def __init__(
        self,
        target: RunnableTarget,
        draft: Any,
        prompts: list[torch.Tensor],
        max_new: int,
        k: int,
        names: Sequence[str],
        dtype: str = "float32",
        log: Callable[[str], None] = print,
        enforce_eager: bool = False,
    ) -> None:
        """prompts [1, P] each: the longest sizes the servers' context, the first is each server's warm-up
        request (not counted). enforce_eager skips vLLM's compile (start ~40 s instead of ~1-2 min) and slows its decode: for tests
        of the rows' bookkeeping, never for a speed comparison."""
        from eaglewire.vllm_client.server import BUILD_HINT, vllm_available

        if not vllm_available():
            raise EaglewireError(
                "the vLLM peer rows need vLLM's CPU build", expected="its venv", found="none", fix=BUILD_HINT
            )
        if target.path is None:
            raise EaglewireError(
                "vLLM loads the target from a model directory",
                expected="a target with a path",
                found="an in-memory model",
                fix="pass --target DIR",
            )
        unknown = [n for n in names if n not in PEER_METHODS]
        if unknown:
            raise ValueError(f"unknown peer rows {unknown}: expected some of {PEER_METHODS}")
        self.target, self.draft, self.max_new, self.k, self.names = target, draft, max_new, k, list(names)
        self.warmup = prompts[0][0].tolist()
        self.max_len = max(p.shape[1] for p in prompts) + max_new + k + 16
        self.dtype, self.log, self.enforce_eager = dtype, log, enforce_eager
        self.eos = target.tokenizer.eos_token_id
        self.servers: dict[str, Any] = {}
        self.before: dict[str, dict] = {}  # vLLM's counters after the warm-up, per EAGLE row
        self._stack = ExitStack()

    def __enter__(self) -> "PeerServers":
        from eaglewire.vllm_client.server import VllmServer, complete_ids, spec_metrics
        from eaglewire.export.convert import export_draft

        with self._stack as stack:  # on a failed start, everything started so far is stopped
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="eaglewire-peer-"))
            export = export_draft(
                self.draft, self.draft.contract, Path(tmp) / "vllm", "vllm", verifier=str(self.target.path)
            )
            for name in self.names:
                spec = (
                    {"method": "eagle3", "model": str(export), "num_speculative_tokens": self.k}
                    if name == "vllm_eagle_chain"
                    else None
                )
                self.log(
                    f"{name}: starting vLLM {'with the EAGLE-3 draft' if spec else 'without a draft'} "
                    f"({self.dtype}); paused between its requests"
                )
                srv = stack.enter_context(
                    VllmServer(
                        self.target.path,
                        dtype=self.dtype,
                        max_model_len=self.max_len,
                        speculative_config=spec,
                        max_num_seqs=1,
                        enforce_eager=self.enforce_eager,
                    )
                )
                complete_ids(srv.base_url, srv.model_name, self.warmup, min(16, self.max_new))  # not counted
                if spec:
                    self.before[name] = spec_metrics(srv.base_url)
                srv.pause()
                self.servers[name] = srv
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def method(self, name: str) -> Callable[[torch.Tensor, int], tuple[list[int], float]]:
        """A bench method on row `name`: (prompt [1, P], max_new) -> (tokens, seconds of the request)."""
        from eaglewire.vllm_client.server import complete_ids

        srv = self.servers[name]

        def run(ids: torch.Tensor, max_new: int) -> tuple[list[int], float]:
            with srv.resumed():
                t0 = time.perf_counter()
                toks = complete_ids(srv.base_url, srv.model_name, ids[0].tolist(), max_new)
                seconds = time.perf_counter() - t0
            return _with_eos(toks, self.eos, max_new), seconds

        return run

    def acceptance(self, name: str) -> dict:
        """{"tau", "per_position"} of row `name`'s measured requests (vLLM's counters); {} for vanilla."""
        from eaglewire.vllm_client.server import spec_metrics

        if name not in self.before:
            return {}
        with self.servers[name].resumed() as srv:
            tau, per = acceptance_between(self.before[name], spec_metrics(srv.base_url), self.k)
        return {"tau": tau, "per_position": per}
