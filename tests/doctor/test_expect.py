"""Acceptance oracle: predicts tau with our engine and flags a measured tau far below it."""

import json

from typer.testing import CliRunner

from eaglewire.doctor.expect import Counts, judge, parse_log, parse_log_counts, wilson


def test_judge_thresholds():
    assert judge(2.4, [0.6], 1.05).flagged  # wiring fault: tau near 1
    assert not judge(2.4, [0.6], 2.2).flagged  # numerics / scheduling noise
    assert not judge(1.2, [0.1], 1.0).flagged  # within the margin when the prediction itself is low
    assert judge(2.4, [0.6], 1.05).causes[0].startswith("layer ids")


def test_each_printed_tau_names_its_kind():
    """The prediction is the `expect` kind, the measured one the engine's (eaglewire.tau.TAU_KINDS)."""
    import pytest

    from eaglewire.tau import TAU_KINDS, named_tau

    assert "tau (expect) 2.40 predicted" in judge(2.4, [0.6], 2.2).message
    assert "tau (expect) 2.40" in judge(2.4, [0.6], None).message
    assert set(TAU_KINDS) >= {"teacher-forced", "doctor's engine", "expect", "bench", "live"}
    with pytest.raises(ValueError):
        named_tau("measured", 1.0)


def test_first_position_rule_catches_what_the_tau_rule_misses():
    """The issue's case: a tau-1.30 draft predicted 0.24 at the first position; the embedding tap measured
    tau 1.10 in real vLLM (first position ~0.08): inside the tau rule's bounds, outside the interval."""
    assert not judge(1.30, [0.24, 0.05, 0.02], 1.10).flagged  # the tau rule alone
    fault = Counts(drafts=400, accepted_per_position=[32, 6, 2])  # 0.08, tau 1.10
    res = judge(1.30, [0.24, 0.05, 0.02], None, fault)
    assert res.flagged and abs(res.measured_tau - 1.10) < 1e-9 and "below by more than the margin" in res.message
    lo, hi = res.measured_first[1:]
    assert lo < 0.08 < hi < 0.24 - 0.05
    healthy = Counts(drafts=400, accepted_per_position=[94, 18, 7])  # 0.235 vs 0.24 predicted
    assert not judge(1.30, [0.24, 0.05, 0.02], None, healthy).flagged
    few = Counts(drafts=12, accepted_per_position=[1, 0, 0])  # too few drafts for a verdict on the position
    assert not judge(1.30, [0.24, 0.05, 0.02], None, few).flagged


def test_wilson_interval_against_the_normal_approximation():
    lo, hi = wilson(0.5, 10_000)  # large n: the Wald interval 0.5 +- 2.5758 * 0.005
    assert abs(lo - (0.5 - 2.575829 * 0.005)) < 1e-4 and abs(hi - (0.5 + 2.575829 * 0.005)) < 1e-4
    lo, hi = wilson(0.0, 50)
    assert lo == 0.0 or abs(lo) < 1e-12
    assert 0 < hi < 0.15


def test_parse_vllm_counts_pooled_over_intervals():
    line = (
        "SpecDecoding metrics: Mean acceptance length: {tau}, Accepted throughput: 1.00 tokens/s, Drafted "
        "throughput: 3.00 tokens/s, Accepted: {acc} tokens, Drafted: {drafted} tokens, Per-position acceptance "
        "rate: {rates}, Avg Draft acceptance rate: 10.0%"
    )
    text = "\n".join(
        [
            line.format(tau=1.5, acc=30, drafted=180, rates="0.300, 0.150, 0.050"),
            line.format(tau=1.2, acc=12, drafted=180, rates="0.150, 0.050, 0.000"),
        ]
    )
    c = parse_log_counts(text)
    assert c.drafts == 120 and [round(a) for a in c.accepted_per_position] == [27, 12, 3]
    assert parse_log_counts("nothing") is None


def test_parse_engine_logs():
    sglang = (
        "Decode batch. #running-req: 1, #token: 90, accept len: 1.02, gen throughput (token/s): 40\n"
        "Decode batch. #running-req: 1, #token: 130, accept len: 1.00\n"
    )
    assert abs(parse_log(sglang) - 1.01) < 1e-9
    vllm = "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 10 tokens/s"
    assert parse_log(vllm) == 2.5 and parse_log("nothing here") is None


def test_expect_cli_on_tiny_pipeline(tmp_path):
    """A draft trained on the tiny target's own continuations: prediction > 1; a measured 1.0 is flagged."""
    from tiny import build_draft

    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.cli.app import app
    from eaglewire.target.loader import load_target
    from test_server import _tiny_target_dir

    tdir = _tiny_target_dir(tmp_path)
    target = load_target(str(tdir))
    draft, contract = build_draft(target, taps=(1, 2, 3))
    save_checkpoint(draft, contract, tmp_path / "draft")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["Say hi."]}))
    args = [
        "doctor",
        "expect",
        "--draft",
        str(tmp_path / "draft"),
        "--target",
        str(tdir),
        "--questions",
        str(q),
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
        "--num-speculative-tokens",
        "2",
        "--json",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    pred = json.loads(r.stdout)["predicted_tau"]
    assert pred >= 1.0
    # not a terminal: a line per prompt while our engine decodes, so minutes of prediction are never silent
    lines = [x for x in r.stderr.splitlines() if "doctor expect: our engine on 1 prompts" in x]
    assert len(lines) == 3 and "prompt 1/1" in lines[1] and lines[-1].endswith("done"), r.stderr
    r = CliRunner().invoke(app, args + ["--measured-tau", str(max(0.5, pred - 2))])
    flagged = json.loads(r.stdout)["flagged"]
    assert flagged == (pred - 2 < 0.75 * pred) and r.exit_code == (1 if flagged else 0)
