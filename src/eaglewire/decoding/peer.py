"""vLLM's CPU build as peer rows of `eaglewire bench`: the same draft (exported for vLLM), prompts (the
exact token ids), knobs (greedy, k) and dtype, one request at a time (single stream).

Each row is one vLLM server (vanilla, or EAGLE-3 with `num_speculative_tokens` k) started for the row and
always stopped after it; a warm-up request runs first and is not counted. Two servers are never up at
once and the peer rows run before our own methods, not interleaved with them: a vLLM engine core spins
on the CPU while it is up, which would slow whatever runs beside it. tok/s is the generated tokens over
the request's wall time seen by the client (HTTP on 127.0.0.1 adds well under a millisecond per request);
tau and per-position acceptance are vLLM's own counters (/metrics), counted over the measured requests.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglewire.decoding.engine import acceptance_length
from eaglewire.errors import EaglewireError

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
        raise EaglewireError("vLLM ran no speculative steps", expected="spec_decode_num_drafts to grow",
                             found=f"{d0} -> {d1}", fix="check the server log: the draft may not have loaded")
    p0 = p0 + [0.0] * (k - len(p0))
    return acceptance_length(a1 - a0, drafts), [(b - a) / drafts for a, b in zip(p0, p1)]


def _with_eos(tokens: list[int], eos: int, max_new: int) -> list[int]:
    """Our loops keep the EOS they stop at; vLLM may leave it out of token_ids."""
    if eos in tokens:
        return tokens[:tokens.index(eos) + 1]
    return tokens + [eos] if len(tokens) < max_new else tokens


def peer_rows(target: Any, draft: Any, prompts: list[torch.Tensor], max_new: int, k: int,
              names: Sequence[str], dtype: str = "float32", log: Callable[[str], None] = print,
              enforce_eager: bool = False) -> dict[str, tuple[list[tuple[list[int], float]], dict]]:
    """{method: ([(tokens, seconds) per prompt], {"tau", "per_position"} or {})} for each vLLM row.
    enforce_eager skips vLLM's compile (start ~40 s instead of ~1-2 min) and slows its decode: for tests of
    the rows' bookkeeping, never for a speed comparison."""
    from eaglewire.clients.vllm import BUILD_HINT, VllmServer, complete_ids, spec_metrics, vllm_available
    from eaglewire.formats.convert import export_draft

    if not vllm_available():
        raise EaglewireError("the vLLM peer rows need vLLM's CPU build", expected="its venv", found="none",
                             fix=BUILD_HINT)
    if target.path is None:
        raise EaglewireError("vLLM loads the target from a model directory", expected="a target with a path",
                             found="an in-memory model", fix="pass --target DIR")
    eos = target.tokenizer.eos_token_id
    ids = [p[0].tolist() for p in prompts]
    max_len = max(len(p) for p in ids) + max_new + k + 16
    out: dict[str, tuple[list[tuple[list[int], float]], dict]] = {}
    with tempfile.TemporaryDirectory(prefix="eaglewire-peer-") as tmp:
        export = export_draft(draft, draft.contract, Path(tmp) / "vllm", "vllm", verifier=str(target.path))
        for name in names:
            spec = {"method": "eagle3", "model": str(export), "num_speculative_tokens": k} \
                if name == "vllm_eagle_chain" else None
            log(f"{name}: starting vLLM {'with the EAGLE-3 draft' if spec else 'without a draft'} ({dtype})")
            with VllmServer(target.path, dtype=dtype, max_model_len=max_len, speculative_config=spec,
                            max_num_seqs=1, enforce_eager=enforce_eager) as srv:
                complete_ids(srv.base_url, srv.model_name, ids[0], min(16, max_new))  # warm-up, not counted
                before = spec_metrics(srv.base_url) if spec else {}
                runs = []
                for p in ids:
                    t0 = time.perf_counter()
                    toks = complete_ids(srv.base_url, srv.model_name, p, max_new)
                    runs.append((_with_eos(toks, eos, max_new), time.perf_counter() - t0))
                acc = {}
                if spec:
                    tau, per = acceptance_between(before, spec_metrics(srv.base_url), k)
                    acc = {"tau": tau, "per_position": per}
            out[name] = (runs, acc)
            log(f"{name}: " + ", ".join(f"{len(t) / s:.1f}" for t, s in runs) + " tok/s")
    return out
