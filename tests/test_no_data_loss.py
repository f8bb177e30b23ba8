"""No job loses data: a fresh `train` never lands on an earlier run, pruning never removes the checkpoint
`latest` names, and a damaged record inside a regeneration file stops with its offset instead of being cut."""

import gzip
import json

import pytest
from tiny import build_target, tiny_samples
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.data.regenerate import append_records, read_done
from eaglewire.capture.features import OnlineFeatures
from eaglewire.errors import CheckpointError, EaglewireError
from eaglewire.train import state as trainer_state
from eaglewire.train.loop import TrainConfig, train
from eaglewire.draft.vocab import VocabMap

import torch


def _setup():
    target = build_target("llama")
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = target.contract((1, 2, 3), vocab_map=vmap)
    return target, vmap, contract, OnlineFeatures(target, contract, pad_id=0)


def test_cli_train_into_a_non_empty_out_is_refused_before_loading_anything(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier run's notes")
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--data",
            "x.jsonl",
            "--vocab",
            str(tmp_path / "none.safetensors"),
            "--out",
            str(out),
            "--target",
            str(tmp_path / "no-target"),
        ],
    )
    assert r.exit_code == 2, r.output
    for field in ("expected:", "found:", "fix:", "notes.txt", "--resume", "new --out"):
        assert field in r.output
    assert (out / "notes.txt").read_text() == "an earlier run's notes"


def test_fresh_run_refused_where_a_run_is_and_resume_continues_it(tmp_path):
    target, vmap, contract, feats = _setup()
    samples = tiny_samples(12)
    c = TrainConfig(max_steps=4, batch_size=4, ckpt_every=1, eval_every=4, ttt_steps=1)
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path, stop_at=3)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert kept == ["step-000002", "step-000003"]
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == kept  # nothing touched
    train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path, resume=True)
    assert trainer_state.latest_state(tmp_path).name == "step-000004"


def test_pruning_never_removes_the_latest_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (5, 900, 950):  # 900 and 950: another run's, copied in
        (root / f"step-{step:06d}").mkdir(parents=True)
    for step in (1, 2, 3):
        (root / f"step-{step:06d}").mkdir(parents=True)
    current = root / "step-000010"
    got = trainer_state.prunable(root, current, keep=2)
    assert current not in got and [p.name for p in got] == ["step-000001", "step-000002", "step-000003"]
    assert trainer_state.prunable(root, root / "step-000001", keep=2) == []
    assert trainer_state.prunable(root, current, keep=1)[-1].name == "step-000005"


def test_latest_naming_a_missing_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000007")
    with pytest.raises(CheckpointError) as err:
        trainer_state.latest_state(tmp_path)
    assert "step-000007" in str(err.value) and err.value.fix


def _three_members(path):
    for i in range(3):
        append_records(path, [{"id": f"c{i}{j}", "messages": []} for j in range(4)])
    raw = path.read_bytes()
    one = len(
        gzip.compress(
            ("".join(json.dumps({"id": f"c0{j}", "messages": []}) + "\n" for j in range(4))).encode(), mtime=0
        )
    )
    return raw, one


def test_damaged_middle_member_stops_with_its_offset_and_changes_nothing(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    raw, one = _three_members(path)
    bad = bytearray(raw)
    bad[one + one // 2] ^= 0xFF  # one flipped byte inside the second member's deflate data
    path.write_bytes(bytes(bad))
    for repair in (False, True):
        with pytest.raises(EaglewireError) as err:
            read_done(path, repair=repair)
        e = err.value
        assert f"offset {one}" in e.what and str(path) in e.what and e.expected and e.found and e.fix
    assert path.read_bytes() == bytes(bad)  # no repair rewrote it
    assert not list(tmp_path.glob("*.bak"))


def test_cut_off_tail_is_repaired_with_a_backup(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    raw, _ = _three_members(path)
    path.write_bytes(raw + raw[:25])  # a kill during the fourth append
    assert len(read_done(path)) == 12 and path.read_bytes() == raw + raw[:25]  # a reader never repairs
    assert len(read_done(path, repair=True)) == 12
    assert path.read_bytes() == raw
    (backup,) = tmp_path.glob("r.jsonl.gz.tail-at-*.bak")
    assert backup.name == f"r.jsonl.gz.tail-at-{len(raw)}.bak" and backup.read_bytes() == raw[:25]


def test_a_member_of_non_records_is_damage(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    append_records(path, [{"id": "a"}])
    with open(path, "ab") as f:
        f.write(gzip.compress(b"[1, 2]\n", mtime=0))
    with pytest.raises(EaglewireError, match="damaged at byte offset"):
        read_done(path)
