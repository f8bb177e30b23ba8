"""Held-out evaluation as a feature (workflows.evaluate_draft, `eaglewire eval`): a saved draft scored offline
gives the very figures `train` logged at its last held-out evaluation of the same samples, and the command
scores any draft directory on a data file."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import build_target, tiny_samples
from typer.testing import CliRunner

from eaglewire.capture.features import OnlineFeatures
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import EaglewireError
from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.train.loop import TrainConfig, train
from eaglewire.workflows import evaluate_draft


def test_a_saved_draft_scores_what_training_logged_on_the_same_samples(tmp_path):
    target = build_target("llama")
    with torch.no_grad():  # a sharper target than random, so the figures are not all near zero
        target.model.lm_head.weight.mul_(30)
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = target.contract((1, 2, 3), vocab_map=vmap)
    samples = tiny_samples(28)
    c = TrainConfig(
        max_steps=12, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=12, ckpt_every=12, ttt_steps=3, dtype="fp32"
    )
    logged = train(
        target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:20], samples[20:], c, tmp_path
    )
    draft = load_checkpoint(tmp_path / "draft", target=target)
    got = evaluate_draft(target, draft, contract, samples[20:], positions=3, batch_size=4, pad_id=0)
    assert got["samples"] == 8 and got["positions"] == logged["positions"]
    for key in ("acc", "chain"):
        assert got[key] == pytest.approx(logged[key], abs=1e-6), key
    assert got["tau_chain"] == pytest.approx(logged["tau_chain"], abs=1e-6)
    assert got["tau_rounds"] == pytest.approx(logged["tau_rounds"], abs=1e-6)
    assert max(got["acc"]) > 0  # trained: something is right (a broken scorer reading zeros would pass the rest)


def test_no_samples_is_a_clear_error():
    target = build_target("llama")
    with pytest.raises(EaglewireError, match="no samples"):
        evaluate_draft(target, None, target.contract((1, 2, 3)), [], pad_id=0)


def test_eval_command_scores_a_draft_directory_on_a_data_file(tmp_path):
    from test_server import _tiny_target_dir

    from eaglewire.cli.app import app
    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.target.loader import load_target
    from tiny import build_draft

    tdir = _tiny_target_dir(tmp_path)
    draft, contract = build_draft(load_target(str(tdir)), taps=(1, 2, 3))
    save_checkpoint(draft, contract, tmp_path / "draft")
    data = tmp_path / "c.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "id": str(i),
                    "conversations": [
                        {"from": "human", "value": f"Count to {i}."},
                        {"from": "gpt", "value": " ".join(map(str, range(i + 8)))},
                    ],
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    args = [
        "eval",
        "--draft",
        str(tmp_path / "draft"),
        "--target",
        str(tdir),
        "--data",
        str(data),
        "--split",
        "all",
        "--positions",
        "2",
        "--json",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{") :])
    # the tiny draft's vocabulary holds none of the answer's tokens: every anchor scored, no position counted
    assert out["samples"] == 3 and len(out["acc"]) == len(out["chain"]) == 2 and out["anchors"] > 0
    r = CliRunner().invoke(app, args[:-3] + ["--split", "test"])
    assert r.exit_code == 2 and "heldout or all" in r.output
