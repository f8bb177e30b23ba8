"""What eaglewire reads from llama-server, checked against llama.cpp's own source (vendored by the
llama-cpp-python sdist, unpacked by scripts/llamacpp_build.sh): the /metrics counter names, the per-request
timings fields, the end-of-request log lines `doctor expect --log` parses, the request fields and command-line
flags eaglewire's client sends. A llama.cpp release that renames one fails here, not silently in a probe.

The source is unpacked per version; locally a missing one skips with the command to unpack it, in CI (CI=true)
its absence is a failure. Versions differ: llama-server's speculative /metrics counters are in 0.3.36's
llama.cpp, not in 0.3.30's (which has the per-request timings only) — the table below is that fact.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from eaglewire.doctor.counters import LLAMACPP_NAMES, LLAMACPP_PER_POS, LLAMACPP_PREFIX, LLAMACPP_TIMINGS
from eaglewire.doctor.expect import LLAMACPP_COUNTS, LOG_PATTERNS, parse_log, parse_log_counts
from eaglewire.errors import EaglewireError
from eaglewire.serve.llamacpp import BUILD_HINT, llamacpp_root, llamacpp_source

# llama-cpp-python version -> whether its llama.cpp writes the speculative counters in /metrics
SPEC_COUNTERS_IN = {"0.3.36": True, "0.3.30": False}


def _source(version: str):
    try:
        return llamacpp_source(version)
    except EaglewireError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must unpack llama.cpp {version}: {BUILD_HINT}")
        pytest.skip(f"llama.cpp {version}'s source is not unpacked in {llamacpp_root()}: {BUILD_HINT}")


def _read(src, rel: str) -> str:
    return (src / rel).read_text(errors="replace")


@pytest.mark.parametrize("version", sorted(SPEC_COUNTERS_IN))
def test_metric_names_and_timings_fields_are_llamacpps(version):
    src = _source(version)
    server = "\n".join(
        _read(src, f"tools/server/{f}") for f in ("server-task.cpp", "server-common.cpp", "server-context.cpp")
    )
    for field in LLAMACPP_TIMINGS:  # server_slot_stats::to_json (0.3.36) / the result's timings (0.3.30)
        assert re.search(rf'\["{field}"\]\s*=', server), field
    if not SPEC_COUNTERS_IN[version]:
        assert "spec_decode_num_drafts" not in server
        return
    metrics = _read(src, "tools/server/server-task.cpp")
    prefix = LLAMACPP_PREFIX.removesuffix("spec_decode_")
    assert f'<< "{prefix}"' in metrics  # every counter of server_task_result_metrics::to_metrics gets the prefix
    for name in LLAMACPP_NAMES:  # written as "spec_decode_..._total" items, typed counter
        assert f'"{name.removeprefix(prefix)}_total"' in metrics, name
    assert f'{LLAMACPP_PER_POS}_total{{position=\\""' in metrics  # the labelled per-position series
    assert 'add_items("counter", counters)' in metrics


def _c_format_to_python(fmt: str) -> str:
    return re.sub(
        r"%(\d*)\.?(\d*)([dfs])",
        lambda m: "%" + m.group(1) + (("." + m.group(2)) if m.group(2) else "") + m.group(3),
        fmt,
    )


@settings(max_examples=60, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(st.integers(1, 400), st.lists(st.integers(0, 3), min_size=1, max_size=1)), min_size=1, max_size=4
    ),
    k=st.integers(1, 6),
    short=st.integers(0, 8),
)
def test_expect_reads_the_log_lines_llamacpp_prints(rounds, k, short):
    """The end-of-request lines, formatted with llama.cpp's own format strings (read from its source): the
    acceptance length of each request, and at -lv 4 the per-position rates pooled into counts, the rounds
    counted from the rates (a request's last rounds may draft fewer than k: `short` tokens fewer in all)."""
    src = _source("0.3.36")
    code = _read(src, "tools/server/server-context.cpp")
    acc_fmt = re.search(r'"(draft acceptance = [^"]*)\\n"', code).group(1)
    pos_fmt = re.search(r'"(\s*acc per pos = [^"]*)\\n"', code).group(1)
    prefix = "slot print_timing: id  0 | task 7 | "
    lines, drafts, accepted, means = [], 0, [0.0] * k, []
    for n_rounds, (a,) in rounds:
        acc_pos = [n_rounds if i < min(a, k) else 0 for i in range(k)]  # every round accepted min(a, k) tokens
        n_acc, generated = sum(acc_pos), max(n_rounds * k - short, n_rounds)
        mean = 1 + n_acc / n_rounds
        lines.append(prefix + _c_format_to_python(acc_fmt) % (n_acc / generated, n_acc, generated, mean))
        lines.append(prefix + _c_format_to_python(pos_fmt) % ", ".join(f"{x / n_rounds:.3f}" for x in acc_pos))
        drafts += n_rounds if n_acc else generated / k  # nothing accepted: no rate to count rounds by, G / k
        means.append(float(f"{mean:5.2f}"))
        accepted = [x + y for x, y in zip(accepted, acc_pos)]
    text = "\n".join(lines) + "\n"
    assert len(LLAMACPP_COUNTS.findall(text)) == len(rounds)
    assert len(LOG_PATTERNS["llamacpp"].findall(text)) == len(rounds)
    assert parse_log(text) == pytest.approx(sum(means) / len(means))
    c = parse_log_counts(text)
    assert c.drafts == pytest.approx(drafts, rel=2e-3)  # rates printed with 3 decimals: within that rounding
    assert c.accepted_per_position == pytest.approx(accepted, abs=1e-3 * c.drafts)


def test_the_clients_flags_and_request_fields_exist_in_llamacpp(monkeypatch, tmp_path):
    """Every flag LlamaServer passes is one of llama.cpp's options (common/arg.cpp), every request field one
    its server reads (tools/server/server-schema.cpp; token-id prompts: server-common.cpp)."""
    from eaglewire.serve.llamacpp import LlamaServer

    src = _source("0.3.36")
    fake = tmp_path / "llama-server"
    fake.write_text("")
    monkeypatch.setenv("EAGLEWIRE_LLAMA_SERVER", str(fake))
    cmd = LlamaServer(tmp_path / "t.gguf", tmp_path / "d.gguf").command()
    args = _read(src, "common/arg.cpp")
    flags = [a for a in cmd if a.startswith("-")]
    assert {"-md", "--spec-type", "--spec-draft-n-max", "--metrics", "--poll"} <= set(flags)
    for flag in flags:
        assert re.search(rf'[{{ ]"{re.escape(flag)}"[,}}]', args), flag
    from eaglewire.families import FAMILIES

    names = _read(src, "common/speculative.cpp")
    for fam in FAMILIES.values():  # each family record's --spec-type is one of llama.cpp's names
        assert re.search(rf'{{"{fam.llamacpp_spec_type}",\s*COMMON_SPECULATIVE_TYPE_', names), fam.name
    schema = _read(src, "tools/server/server-schema.cpp")
    for field in ("n_predict", "temperature", "top_k", "seed", "cache_prompt", "return_tokens"):
        assert f'"{field}"' in schema, field
    assert '"prompt": [12, 34, 56]' in _read(src, "tools/server/server-common.cpp")  # a prompt of token ids
