"""A running engine's speculative-decoding counters: one reader per engine format, and their deltas.

    snapshot = read_counters("vllm", metrics_text)       # cumulative since the server started
    window = later.minus(earlier)                          # what happened between two snapshots
    window.tau, window.per_position                        # acceptance over that window only

Formats (each engine's own code is the source):
- vLLM's Prometheus /metrics (v1/spec_decode/metrics.py, `SpecDecodingProm`): counters
  `vllm:spec_decode_num_drafts` (verify rounds that carried a draft), `…_num_draft_tokens`,
  `…_num_accepted_tokens` and `…_num_accepted_tokens_per_pos{position="i"}` (rounds whose draft was accepted
  up to position i, i = 0..k-1: one series per drafted position, so k is the number of position labels; the
  same holds for a draft of any family that proposes k tokens a round, EAGLE-3 or DFlash). Exposed with a
  `_total` suffix and labels (model_name, engine) summed here, in any order, with any whitespace.
- eaglewire's own server (serve/server.py) writes the same vLLM names beside its `eaglewire_*` ones.
- SGLang (python/sglang/srt/metrics/collector.py) has NO counters: `sglang:spec_accept_length` and
  `sglang:spec_accept_rate` are gauges holding the mean of its last decode-log interval, and its log prints
  "accept len: X" per interval. No delta and no per-position figure can be had from either; its reader
  returns the gauge (a window of SGLang's own choosing, not ours) and says so (`Counters.gauge_only`).
- llama.cpp's llama-server with --metrics (tools/server/server-task.cpp, `server_task_result_metrics::to_metrics`):
  vLLM's counters under its own prefix, `llamacpp:spec_decode_num_drafts_total` (verification steps),
  `…_num_draft_tokens_total`, `…_num_accepted_tokens_total` and
  `…_num_accepted_tokens_per_pos_total{position="i"}` (one series per drafted position, written only once a
  request with a draft has finished: llama-server adds a request's counts when it ends, never mid-stream).
  Per request it also returns `timings.draft_n` / `timings.draft_n_accepted` (tools/server/server-common.cpp,
  `server_slot_stats::to_json`; absent for a request without a draft) and logs "draft acceptance = …
  (A accepted / G generated), mean len = X" when a request ends (tools/server/server-context.cpp);
  tests/doctor/test_llamacpp_names.py reads these names from the vendored source.

tau is eaglewire.tau.acceptance_length (the one definition; vLLM's "mean acceptance length").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from eaglewire.errors import EaglewireError
from eaglewire.tau import acceptance_length

VLLM_PREFIX = "vllm:spec_decode_"
VLLM_NAMES = {
    f"{VLLM_PREFIX}num_drafts": "drafts",
    f"{VLLM_PREFIX}num_draft_tokens": "draft_tokens",
    f"{VLLM_PREFIX}num_accepted_tokens": "accepted",
}
VLLM_PER_POS = f"{VLLM_PREFIX}num_accepted_tokens_per_pos"
LLAMACPP_PREFIX = "llamacpp:spec_decode_"  # the names above, for llama-server
LLAMACPP_NAMES = {
    f"{LLAMACPP_PREFIX}num_drafts": "drafts",
    f"{LLAMACPP_PREFIX}num_draft_tokens": "draft_tokens",
    f"{LLAMACPP_PREFIX}num_accepted_tokens": "accepted",
}
LLAMACPP_PER_POS = f"{LLAMACPP_PREFIX}num_accepted_tokens_per_pos"
LLAMACPP_TIMINGS = ("draft_n", "draft_n_accepted")  # per request: draft tokens proposed, accepted
SGLANG_GAUGES = {"sglang:spec_accept_length": "tau", "sglang:spec_accept_rate": "rate"}


@dataclass(frozen=True)
class Counters:
    """One snapshot (or the delta of two) of an engine's speculative counters.

    drafts: verify rounds that carried a draft; accepted: draft tokens accepted; accepted_per_pos[i]: rounds
    accepted at least up to draft position i. None where the engine does not expose the figure."""

    engine: str
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: tuple[float, ...] = ()
    gauge_tau: float | None = None  # an engine's own running mean (SGLang), when it has no counters
    found: tuple[str, ...] = field(default=(), compare=False)  # metric names read (for the error message)

    @property
    def exposed(self) -> bool:
        """Whether the engine exposes any speculative figure at all."""
        return self.drafts is not None or self.gauge_tau is not None

    @property
    def gauge_only(self) -> bool:
        return self.drafts is None and self.gauge_tau is not None

    @property
    def k(self) -> int | None:
        """Draft positions per round as the engine reports them (number of per-position series)."""
        return len(self.accepted_per_pos) or None

    @property
    def tau(self) -> float | None:
        if self.drafts:
            return acceptance_length(self.accepted or 0.0, self.drafts)
        return self.gauge_tau if self.drafts is None else None

    @property
    def per_position(self) -> list[float]:
        """Acceptance rate at each draft position (share of rounds accepted up to it)."""
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []

    def minus(self, before: "Counters") -> "Counters":
        """The window between `before` and this snapshot. A counter that went down means the server restarted
        in between: refused, never read as a negative window."""
        if before.engine != self.engine:
            raise EaglewireError(
                "counter snapshots of two engines",
                expected="two snapshots of one server",
                found=f"{before.engine} then {self.engine}",
            )
        if self.gauge_only:
            return self  # nothing to subtract: the gauge already is SGLang's own window

        def sub(a: float | None, b: float | None, name: str) -> float | None:
            if a is None:
                return None
            d = a - (b or 0.0)
            if d < 0:
                raise EaglewireError(
                    f"the server's {name} counter went down between two snapshots",
                    expected="monotone counters (one server, running throughout)",
                    found=f"{b} then {a}",
                    fix="the server restarted: probe again",
                )
            return d

        k = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad = lambda t: tuple(t) + (0.0,) * (k - len(t))  # noqa: E731 (a position first seen in the later one)
        return replace(
            self,
            drafts=sub(self.drafts, before.drafts, "drafts"),
            draft_tokens=sub(self.draft_tokens, before.draft_tokens, "draft tokens"),
            accepted=sub(self.accepted, before.accepted, "accepted tokens"),
            accepted_per_pos=tuple(
                sub(a, b, f"position {i}")
                for i, (a, b) in enumerate(zip(pad(self.accepted_per_pos), pad(before.accepted_per_pos)))
            ),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "tau": _finite(self.tau),
            "per_position": [round(p, 4) for p in self.per_position],
            "gauge_only": self.gauge_only,
        }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 4)


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition (prometheus_client's parser: escaping, labels, spacing)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(s.name, s.labels, float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples]
    except ValueError as err:
        raise EaglewireError(
            "the server's /metrics is not Prometheus text",
            expected="the text exposition format",
            found=f"{err}: {text[:200]!r}",
        ) from None


def _base(name: str) -> str:
    return name.removesuffix("_total")  # a counter's sample carries _total; _created samples are other names


def read_vllm_metrics(text: str, engine: str = "vllm") -> Counters:
    """vLLM's names (module docstring): label sets summed (several engines or models behind one server)."""
    return _read_counter_names(text, engine, VLLM_NAMES, VLLM_PER_POS)


def read_llamacpp_metrics(text: str) -> Counters:
    """llama-server's /metrics (module docstring): vLLM's counters under the `llamacpp:` prefix. A server
    started without a draft writes the three totals as 0 and no per-position series."""
    return _read_counter_names(text, "llamacpp", LLAMACPP_NAMES, LLAMACPP_PER_POS)


def _read_counter_names(text: str, engine: str, names: dict[str, str], per_pos_name: str) -> Counters:
    """Sum every label set of the counters `names` (metric -> field) and of the per-position counter."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value in _samples(text):
        base = _base(name)
        if base in names:
            sums[names[base]] = sums.get(names[base], 0.0) + value
        elif base == per_pos_name:
            pos = labels.get("position")
            if pos is None or not pos.isdigit():
                raise EaglewireError(
                    f"{per_pos_name} without a position label", expected='position="0", "1", ...', found=str(labels)
                )
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + value
    if per_pos and sorted(per_pos) != list(range(len(per_pos))):
        raise EaglewireError("per-position counters with gaps", expected="positions 0..k-1", found=str(sorted(per_pos)))
    return Counters(
        engine,
        sums.get("drafts"),
        sums.get("draft_tokens"),
        sums.get("accepted"),
        tuple(per_pos[i] for i in sorted(per_pos)),
        found=tuple(sorted(sums)),
    )


def read_sglang_metrics(text: str) -> Counters:
    """SGLang's gauges: the mean accept length of its last decode-log interval (no counters exist)."""
    vals = {SGLANG_GAUGES[n]: v for n, _labels, v in _samples(text) if n in SGLANG_GAUGES}
    # SGLang reports 0 before any speculative round; a real acceptance length is >= 1
    tau = vals.get("tau")
    return Counters("sglang", gauge_tau=tau if tau is not None and tau >= 1.0 else None, found=tuple(sorted(vals)))


def read_sglang_log(text: str) -> Counters:
    """SGLang's "Decode batch ... accept len: X" lines: the mean of the intervals printed in `text` (pass the
    lines written between two snapshots; each interval weighs the same, SGLang prints no round count)."""
    from eaglewire.doctor.expect import LOG_PATTERNS  # the one pattern `doctor expect --log` reads

    values = [float(v) for v in LOG_PATTERNS["sglang"].findall(text)]
    return Counters("sglang", gauge_tau=sum(values) / len(values) if values else None)


READERS: dict[str, Callable[[str], Counters]] = {  # engine -> reader of its /metrics text
    "vllm": read_vllm_metrics,
    "eaglewire": lambda text: read_vllm_metrics(text, "eaglewire"),  # the vLLM names, written by serve/server.py
    "sglang": read_sglang_metrics,
    "llamacpp": read_llamacpp_metrics,
}


def detect_engine(text: str) -> str:
    """Which engine wrote this /metrics text: eaglewire's server writes eaglewire_* beside vLLM's names."""
    names = {n for n, _l, _v in _samples(text)}
    if any(n.startswith("eaglewire_") for n in names):
        return "eaglewire"
    if any(n.startswith("sglang:") for n in names):
        return "sglang"
    if any(n.startswith("vllm:") for n in names):
        return "vllm"
    if any(n.startswith("llamacpp:") for n in names):
        return "llamacpp"
    raise EaglewireError(
        "cannot tell which engine serves this /metrics",
        expected="vllm:*, sglang:*, llamacpp:* or eaglewire_* metrics",
        found=f"{len(names)} other names, e.g. {sorted(names)[:5]}",
        fix="name it: --engine vllm|sglang|llamacpp|eaglewire (llama-server needs --metrics)",
    )


def read_counters(engine: str, text: str) -> Counters:
    if engine not in READERS:
        raise EaglewireError(f"no counter reader for engine {engine!r}", expected=", ".join(READERS), found=engine)
    return READERS[engine](text)
