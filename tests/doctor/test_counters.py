"""The engines' speculative counters read back (one parser per format, property-tested), their deltas, the
server's vLLM-named mirror, the live probe's verdict and the watch alarm. No model: seconds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from eaglewire.doctor.counters import Counters, detect_engine, read_counters, read_sglang_log, read_vllm_metrics
from eaglewire.errors import EaglewireError

DATA = Path(__file__).parents[1] / "data" / "live"
P = "vllm:spec_decode_"

label_names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True).filter(lambda s: s != "position")
label_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)
counts = st.integers(0, 10**9)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(name: str, labels: dict[str, str], value: float, ws: str) -> str:
    body = ",".join(f'{k}{ws}={ws}"{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{body}}}{ws or ' '}{value}" if labels else f"{name}{ws or ' '}{value}"


@settings(max_examples=200, deadline=None)
@given(
    drafts=counts,
    tokens=counts,
    accepted=counts,
    per_pos=st.lists(counts, min_size=1, max_size=8),
    labels=st.dictionaries(label_names, label_values, max_size=3),
    ws=st.sampled_from(["", " ", "  ", "\t"]),
    seed=st.integers(0, 2**16),
    suffix=st.booleans(),
    other=st.lists(counts, max_size=3),
)
def test_vllm_reader_recovers_every_counter_whatever_the_labels_order_and_spacing(
    drafts, tokens, accepted, per_pos, labels, ws, seed, suffix, other
):
    sfx = "_total" if suffix else ""
    lines = [
        _series(f"{P}num_drafts{sfx}", labels, drafts, ws),
        _series(f"{P}num_draft_tokens{sfx}", labels, tokens, ws),
        _series(f"{P}num_accepted_tokens{sfx}", labels, accepted, ws),
    ]
    lines += [
        _series(f"{P}num_accepted_tokens_per_pos{sfx}", {**labels, "position": str(i)}, v, ws)
        for i, v in enumerate(per_pos)
    ]
    lines += [_series("vllm:num_requests_running", labels, v, ws) for v in other]  # other metrics are ignored
    random.Random(seed).shuffle(lines)
    text = "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n" + "\n".join(lines) + "\n"
    c = read_vllm_metrics(text)
    assert (c.drafts, c.draft_tokens, c.accepted) == (drafts, tokens, accepted)
    assert c.accepted_per_pos == tuple(per_pos) and c.k == len(per_pos)
    assert detect_engine(text) == "vllm"


@settings(max_examples=100, deadline=None)
@given(a=st.lists(counts, min_size=4, max_size=4), b=st.lists(counts, min_size=4, max_size=4))
def test_label_sets_are_summed_and_deltas_subtract(a, b):
    """Two engines (or models) behind one /metrics add up; a later snapshot minus an earlier one is the window."""

    def text(vals, engine):
        return (
            "\n".join(
                [
                    f'{P}num_drafts_total{{engine="{engine}"}} {vals[0]}',
                    f'{P}num_accepted_tokens_total{{engine="{engine}"}} {vals[1]}',
                ]
                + [
                    f'{P}num_accepted_tokens_per_pos_total{{engine="{engine}",position="{i}"}} {v}'
                    for i, v in enumerate(vals[2:])
                ]
            )
            + "\n"
        )

    both = read_vllm_metrics(text(a, "0") + text(b, "1"))
    assert both.drafts == a[0] + b[0] and both.accepted_per_pos == (a[2] + b[2], a[3] + b[3])
    before, after = read_vllm_metrics(text(a, "0")), read_vllm_metrics(text([x + y for x, y in zip(a, b)], "0"))
    w = after.minus(before)
    assert (w.drafts, w.accepted, w.accepted_per_pos) == (b[0], b[1], tuple(b[2:]))
    if any(b):
        with pytest.raises(EaglewireError, match="went down"):
            before.minus(after)


def test_window_tau_and_per_position_use_the_one_tau_definition():
    c = Counters("vllm", drafts=100.0, draft_tokens=300.0, accepted=60.0, accepted_per_pos=(40.0, 15.0, 5.0))
    assert c.tau == pytest.approx(1.6) and c.per_position == [0.4, 0.15, 0.05]
    assert Counters("vllm", drafts=0.0).tau is None  # no round: no tau, not nan


def test_no_speculative_counters_and_unknown_engines():
    plain = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="t"} 0.0\n'
    assert not read_vllm_metrics(plain).exposed
    with pytest.raises(EaglewireError, match="which engine"):
        detect_engine("foo_total 1\n")
    with pytest.raises(EaglewireError, match="position"):
        read_vllm_metrics(
            f'{P}num_accepted_tokens_per_pos_total{{position="0"}} 1\n'
            f'{P}num_accepted_tokens_per_pos_total{{position="2"}} 1\n'
        )


def test_recorded_vllm_metrics_read_back():
    """/metrics as vLLM's CPU build 0.32 wrote it after a greedy run with k=3 (recorded in tests/data/live)."""
    text = (DATA / "vllm_metrics.txt").read_text()
    assert detect_engine(text) == "vllm"
    c = read_counters("vllm", text)  # its _created samples (timestamps) are other series, not counts
    assert (c.drafts, c.draft_tokens, c.accepted, c.accepted_per_pos) == (163, 489, 94, (61, 24, 9))
    assert c.k == 3 and c.tau == pytest.approx(1 + 94 / 163)


def test_sglang_reader_on_recorded_output():
    """SGLang cannot run here (no CPU wheel): its /metrics and log lines as recorded in its docs and CI logs.
    It has gauges only (the last log interval's mean), no counters and no per-position figures."""
    text = (DATA / "sglang_metrics.txt").read_text()
    assert detect_engine(text) == "sglang"
    c = read_counters("sglang", text)
    assert c.gauge_only and c.tau == pytest.approx(2.35) and c.per_position == [] and c.k is None
    assert c.minus(c) is c  # no counters to subtract: the gauge is SGLang's own window
    log = read_sglang_log((DATA / "sglang_server.log").read_text())
    assert log.gauge_only and log.tau == pytest.approx((2.41 + 2.29 + 2.52) / 3)
    idle = read_counters("sglang", 'sglang:spec_accept_length{model_name="m"} 0.0\n')
    assert not idle.exposed  # SGLang's 0 before any round (or without speculation) is no acceptance length


@settings(max_examples=100, deadline=None)
@given(rounds=st.lists(st.lists(st.integers(0, 5), max_size=20), max_size=5), depth=st.integers(1, 5))
def test_eaglewire_server_mirror_reads_back_as_vllm(rounds, depth):
    """serve/spec_metrics.py writes what read_vllm_metrics reads: the same rounds, positions and tau."""
    from eaglewire.decoding.engine import SpecStats
    from eaglewire.serve.spec_metrics import VllmSpecCounters

    rounds = [[min(a, depth) for a in r] for r in rounds]
    m = VllmSpecCounters(depth=depth)
    for r in rounds:
        m.count(r)
    c = read_counters("eaglewire", m.prometheus())
    flat = [a for r in rounds for a in r]
    assert c.k == depth and c.drafts == len(flat) and c.draft_tokens == depth * len(flat)
    assert c.accepted == sum(flat)
    if flat:
        st_ = SpecStats(accepted=flat)
        assert c.per_position == pytest.approx(st_.per_position(depth)) and c.tau == pytest.approx(st_.tau)


@settings(max_examples=100, deadline=None)
@given(drafts=counts, tokens=counts, accepted=counts, per_pos=st.lists(counts, max_size=8), seed=st.integers(0, 2**16))
def test_llamacpp_reader_recovers_every_counter_in_its_layout(drafts, tokens, accepted, per_pos, seed):
    """llama-server's /metrics layout (tools/server/server-task.cpp, to_metrics: HELP and TYPE per item, the
    `_total` in the family name, other counters and gauges beside; the per-position family only once a request
    with a draft ended): every figure read back, the engine detected."""
    from eaglewire.doctor.counters import read_llamacpp_metrics

    items = [
        ("prompt_tokens_total", "counter", 17),
        ("n_decode_total", "counter", 99),
        ("spec_decode_num_draft_tokens_total", "counter", tokens),
        ("spec_decode_num_accepted_tokens_total", "counter", accepted),
        ("spec_decode_num_drafts_total", "counter", drafts),
        ("predicted_tokens_seconds", "gauge", 80.5),
        ("requests_processing", "gauge", 0),
    ]
    random.Random(seed).shuffle(items)
    text = "".join(f"# HELP llamacpp:{n} what it is\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {v}\n" for n, t, v in items)
    if per_pos:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        text += f"# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n"
        text += "".join(f'{name}{{position="{i}"}} {v}\n' for i, v in enumerate(per_pos))
    assert detect_engine(text) == "llamacpp"
    c = read_llamacpp_metrics(text)
    assert (c.drafts, c.draft_tokens, c.accepted) == (drafts, tokens, accepted)
    assert c.accepted_per_pos == tuple(per_pos) and c.k == (len(per_pos) or None)
    assert read_counters("llamacpp", text) == c


def test_recorded_llamacpp_metrics_and_log_read_back():
    """/metrics and the end-of-request log lines of a real llama-server (0.3.36's llama.cpp, k=3, 3 greedy
    requests; tests/data/live/README.md): the counters, and the log pooled by `doctor expect --log` into the same
    rounds (its rounds counted from the rates: some rounds drafted fewer than k, 272 tokens in 93 rounds)."""
    from eaglewire.doctor.expect import parse_log, parse_log_counts

    text = (DATA / "llamacpp_metrics.txt").read_text()
    assert detect_engine(text) == "llamacpp"
    c = read_counters("llamacpp", text)
    assert (c.drafts, c.draft_tokens, c.accepted, c.accepted_per_pos) == (93, 272, 47, (35, 10, 2))
    assert c.k == 3 and c.tau == pytest.approx(1 + 47 / 93)
    log = (DATA / "llamacpp_server.log").read_text()
    counts = parse_log_counts(log)
    assert counts.drafts == pytest.approx(93, abs=0.1)
    assert counts.accepted_per_position == pytest.approx([35, 10, 2], abs=0.1)
    assert parse_log(log) == pytest.approx((1.35 + 1.47 + 1.74) / 3)  # each request's printed mean length
