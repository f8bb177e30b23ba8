"""Acceptance oracle: predicts tau with our engine and flags a measured tau far below it."""

import json

from typer.testing import CliRunner

from eaglewire.doctor.expect import judge, parse_log


def test_judge_thresholds():
    assert judge(2.4, [0.6], 1.05).flagged  # wiring fault: tau near 1
    assert not judge(2.4, [0.6], 2.2).flagged  # numerics / scheduling noise
    assert not judge(1.2, [0.1], 1.0).flagged  # within the margin when the prediction itself is low
    assert judge(2.4, [0.6], 1.05).causes[0].startswith("layer ids")


def test_parse_engine_logs():
    sglang = ("Decode batch. #running-req: 1, #token: 90, accept len: 1.02, gen throughput (token/s): 40\n"
              "Decode batch. #running-req: 1, #token: 130, accept len: 1.00\n")
    assert abs(parse_log(sglang) - 1.01) < 1e-9
    vllm = "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 10 tokens/s"
    assert parse_log(vllm) == 2.5 and parse_log("nothing here") is None


def test_expect_cli_on_tiny_pipeline(tmp_path):
    """A draft trained on the tiny target's own continuations: prediction > 1; a measured 1.0 is flagged."""
    from tiny import build_draft

    from eaglewire.checkpoint import save_checkpoint
    from eaglewire.cli.app import app
    from eaglewire.verifier.loader import load_target
    from test_server import _tiny_target_dir

    tdir = _tiny_target_dir(tmp_path)
    target = load_target(str(tdir))
    draft, contract = build_draft(target, taps=(1, 2, 3))
    save_checkpoint(draft, contract, tmp_path / "draft")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["Say hi."]}))
    args = ["doctor", "expect", "--draft", str(tmp_path / "draft"), "--target", str(tdir), "--questions", str(q),
            "--limit", "1", "--max-new-tokens", "8", "--num-speculative-tokens", "2", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    pred = json.loads(r.stdout)["predicted_tau"]
    assert pred >= 1.0
    r = CliRunner().invoke(app, args + ["--measured-tau", str(max(0.5, pred - 2))])
    flagged = json.loads(r.stdout)["flagged"]
    assert flagged == (pred - 2 < 0.75 * pred) and r.exit_code == (1 if flagged else 0)
