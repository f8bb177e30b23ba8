"""The fast runtime's GEMM layout calibration, measured once per machine and reused by the next start.

`calibrate()` takes seconds (a few hundred verify forwards) and its answer depends only on what is
keyed here: the CPU (model, ISA flags, whether bf16 is native), torch's version and CPU capability, the
thread count, the target's shapes and dtype, the candidate layouts and greedy heads (plain, or the bf16
screen of screened_head.py, and the screen's REVISION: its cost is what was timed) and the row counts /
repetitions timed. The answer, a layout and a greedy head
per row count, goes to `<cache_root>/calibration/<hash of the key>.json` (written to a temporary file,
then renamed) with the key itself and the medians measured, so a reader can see why a choice won.

An unreadable or inconsistent file (truncated, hand-edited, a layout this build no longer offers) is
recalibrated and rewritten, with a message naming the file and the problem: the file is derived data
rebuilt in seconds, so refusing to start a server over it would help nobody, and the message keeps the
rebuild from being silent. A calibration measured on a busy machine stays until its file is deleted.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from eaglewire.cache import cache_root
from eaglewire.contract import canonical_json
from eaglewire.fastcpu import panel_gemm
from eaglewire.fastcpu.compiled_body import GRAPH, GRAPH_GEMMS
from eaglewire.fastcpu.gemm import COMPILED, PANELS, REFINE_REPS, applies, row_counts
from eaglewire.fastcpu.runtime import CALIBRATION_KS, CALIBRATION_PREFIX, CALIBRATION_REPS, FastRuntime, cache_slots
from eaglewire.fastcpu.screened_head import REVISION as SCREEN_REVISION
from eaglewire.decoding.layers import head_dim
from eaglewire.hw import describe_cpu
from eaglewire.safeio import atomic_write_text
from eaglewire.target.loader import Target

# 2: the greedy head (plain / screened, screened_head.py) per row count beside the layouts
# 3: the graph's inductor options and unfused attention (compiled_body.py) changed what "graph" costs
# 4: packed_linear's kernel lost its Python frame (compiled_body.py): calibrations made at a caller depth
#    where that frame thrashed CPython's frame-stack chunks timed "graph" slow and chose dnnl
# 5: the graph's C++ wrapper (compiled_body.GRAPH_OPTIONS) changed what "graph" costs, and compiled-layout
#    markers must not promise graphs that inductor's cache holds only with the Python wrapper
# 6: the graph runs its multi-row GEMMs through the panel GEMM or oneDNN's, whichever the calibration timed
#    faster (panel_gemm.py, a new layout; the file stores the choice)
FORMAT = 6  # bump when the file's meaning changes: older files then miss (another key), never misread


class _Unusable(Exception):
    """A calibration file that cannot be used as it is (the reason is the message)."""


def _target_shapes(target: Target) -> dict[str, Any]:
    """What a fast runtime's GEMM and graph shapes depend on, read off the target (not its weights)."""
    cfg = target.text_config
    return {
        "model_type": cfg.model_type,
        "hidden_size": int(cfg.hidden_size),
        "intermediate_size": int(cfg.intermediate_size),
        "num_layers": len(target.layers),
        "heads": int(cfg.num_attention_heads),
        "kv_heads": int(cfg.num_key_value_heads),
        "head_dim": head_dim(cfg),
        "vocab_size": int(target.model.get_output_embeddings().weight.shape[0]),
        "dtype": str(target.dtype).removeprefix("torch."),
        "qkv_bias": target.layers[0].self_attn.q_proj.bias is not None,
    }


def calibration_key(rt: FastRuntime, ks: tuple[int, ...], reps: int, refine: int = REFINE_REPS) -> dict[str, Any]:
    """Everything the measured policy depends on (and nothing it does not: weights, max_len)."""
    cpu = describe_cpu()  # model, isa, threads, native_bf16, torch_capability
    return {
        "format": FORMAT,
        "cpu": cpu,
        "torch": torch.__version__,
        "target": _target_shapes(rt.target),
        "layouts": list(rt.candidates),
        "heads": list(rt.head_candidates),
        "screen_revision": SCREEN_REVISION,
        "ks": list(row_counts(ks, rt.candidates)),
        "reps": reps,
        "refine": refine,
        "cached_tokens": CALIBRATION_PREFIX,
        # the panel kernel's build (its source, compiler, torch): a changed kernel is timed anew
        "panel_gemm": {lay: panel_gemm.build_dir(k).name for lay, k in PANELS.items() if lay in rt.candidates},
    }


def calibration_dir() -> Path:
    return cache_root() / "calibration"


def _digest(key: dict[str, Any]) -> str:
    """The file name stem of a key: the first 16 hex digits of its canonical JSON's sha256."""
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()[:16]


def calibration_path(key: dict[str, Any]) -> Path:
    return calibration_dir() / f"{_digest(key)}.json"


def _read(path: Path, key: dict[str, Any]) -> tuple[dict[int, str], dict[int, str], str | None]:
    """The stored policies ({rows: layout}, {rows: greedy head}) and the graph's multi-row GEMM, or
    _Unusable saying why not."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _Unusable(f"not readable JSON: {err}") from None
    if not isinstance(data, dict) or data.get("key") != key:
        raise _Unusable("its key is not this machine/target/torch's (a hash collision or an edited file)")
    gemm = data.get("graph_gemm")  # None where no graph is offered
    offered = [g for g in GRAPH_GEMMS if g in key["layouts"]] if GRAPH in key["layouts"] else [None]
    if gemm not in offered:
        raise _Unusable(f"graph_gemm {gemm!r} is not one of {offered} (offered here: {key['layouts']})")
    return (
        _policy(data, "policy", key["ks"], key["layouts"]),
        _policy(data, "head_policy", key["ks"], key["heads"]),
        gemm,
    )


def _policy(data: dict, field: str, ks: list[int], allowed: list[str]) -> dict[int, str]:
    """data[field] as {rows: choice}, covering exactly the timed row counts with allowed choices."""
    raw = data.get(field)
    try:
        policy = {int(k): v for k, v in raw.items()}
    except (AttributeError, TypeError, ValueError):
        raise _Unusable(f"{field} is not a {{rows: choice}} mapping: {raw!r}") from None
    if sorted(policy) != sorted(ks) or not all(isinstance(v, str) and v in allowed for v in policy.values()):
        raise _Unusable(f"{field} {raw!r} does not cover rows {ks} with choices {allowed}")
    if field == "policy" and not all(applies(v, k) for k, v in policy.items()):
        raise _Unusable(f"{field} {raw!r} gives a layout rows it does not apply to ({COMPILED} is one row only)")
    return policy


def calibrate_cached(
    rt: FastRuntime,
    log: Callable[[str], None] | None = None,
    ks: tuple[int, ...] = CALIBRATION_KS,
    reps: int = CALIBRATION_REPS,
    refine: int = REFINE_REPS,
) -> tuple[dict[int, str], Path, bool]:
    """Set rt's layout policy from this machine's cached calibration, measuring (and caching) it when
    there is none. Returns (policy, cache file, reused). `log` hears which of the two happened."""
    say = log or (lambda _msg: None)
    key = calibration_key(rt, ks, reps, refine)
    path = calibration_path(key)
    if _reuse(rt, key, path, say, then="calibrating again"):
        return rt.policy, path, True
    say(
        f"calibrating GEMM layouts {', '.join(key['layouts'])} for {len(ks)} row counts (one-off for this "
        f"machine; cached at {path})"
    )
    t0 = time.perf_counter()
    policy = rt.calibrate(ks, reps, refine)
    record = {
        "key": key,
        "policy": {str(k): v for k, v in policy.items()},
        "median_ms": {str(k): v for k, v in rt.calibration_ms.items()},
        "head_policy": {str(k): v for k, v in rt.head_policy.items()},
        "head_median_ms": {str(k): v for k, v in rt.head_ms.items()},
        "graph_gemm": rt.graph_gemm if rt.graph is not None else None,
        "graph_gemm_ms": {str(k): v for k, v in rt.graph_gemm_ms.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True))
    say(
        f"calibrated in {record['seconds']:.1f} s: {_describe(policy)}; greedy head {_describe(rt.head_policy)}"
        f"{_graph_note(rt)} (delete {path} to measure again)"
    )
    return policy, path, False


def reuse_cached(rt: FastRuntime, log: Callable[[str], None] | None = None) -> Path | None:
    """Set rt's layout policy from this machine's cached calibration where there is a usable one (its file,
    returned), never measuring: a start that must answer in seconds (`eaglewire generate`) keeps the
    uncalibrated layouts otherwise, and says which command measures them once."""
    say = log or (lambda _msg: None)
    key = calibration_key(rt, CALIBRATION_KS, CALIBRATION_REPS, REFINE_REPS)
    path = calibration_path(key)
    if _reuse(rt, key, path, say, then="not used"):
        return path
    say(
        "no GEMM layout calibration for this machine yet: default layouts this time (the same tokens, slower "
        "decode steps); `eaglewire generate --calibrate always` measures them once (seconds to minutes) and "
        f"every later start reuses them ({path})"
    )
    return None


def _reuse(rt: FastRuntime, key: dict[str, Any], path: Path, say: Callable[[str], None], then: str) -> bool:
    """Whether rt's policy was set from the usable calibration file at `path` (an unusable one is said)."""
    if not path.exists():
        return False
    try:
        policy, head_policy, gemm = _read(path, key)
    except _Unusable as why:
        say(f"calibration cache {path} is unusable ({why}): {then}")
        return False
    rt.policy, rt.head_policy = policy, head_policy
    if rt.graph is not None:
        rt.set_graph_gemm(gemm)
    say(
        f"reusing GEMM layout calibration from {path}: {_describe(rt.policy)}; greedy head "
        f"{_describe(rt.head_policy)}{_graph_note(rt)}"
    )
    return True


def _graph_note(rt: FastRuntime) -> str:
    """The graph's multi-row GEMM, where a graph is offered."""
    return f"; the graph's multi-row GEMM {rt.graph_gemm}" if rt.graph is not None else ""


def _describe(policy: dict[int, str]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(policy.items()))


def compiled_marker_dir() -> Path:
    """Where the markers of `compiled_marker` live: inside inductor's own on-disk cache, so that they go
    when it goes (a reboot empties /tmp, its default home) and never claim kernels that are gone."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "eaglewire-compiled"


def compiled_marker(target: Target, max_len: int) -> Path:
    """The file saying that a start on this machine compiled the inductor layouts (compiled_gemv.py, the
    GRAPH of compiled_body.py) for fast runtimes of this target's shapes and of max_len's KV-cache size,
    so that inductor's cache holds them and a later start loads them in seconds instead of compiling for
    a minute (start.make_fast_runtime writes and reads it). Its name hashes what the compiled code
    depends on."""
    key = {
        "format": FORMAT,
        "cpu": describe_cpu(),
        "torch": torch.__version__,
        "target": _target_shapes(target),
        "cache_slots": cache_slots(max_len, graph=True),
    }  # the size a compiled runtime's graphs saw
    return compiled_marker_dir() / f"{_digest(key)}.json"
