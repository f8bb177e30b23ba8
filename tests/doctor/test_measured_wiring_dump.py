"""The measured wiring check on a boundaries dump (capture/boundary_file.py): for targets too large to load here.

The dump of test_doctor_measure's tiny target round-trips bit for bit, and measuring on it (no target)
gives exactly the Measurement measuring with the target gives, for a broken export and a healthy one; a
damaged dump is refused by name; an embedding row the dump does not hold is never read silently; the
CLI's `doctor sample` then `doctor check --boundaries` agrees with `doctor check --target`.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_measured_wiring import TRAINED, _export, bounds, target, trained  # noqa: F401 (fixtures)

from eaglewire.doctor.checks import run_checks
from eaglewire.capture.boundary_file import (
    FORMAT,
    DumpTarget,
    capture_dump,
    load_boundaries,
    load_dump,
    save_boundaries,
)
from eaglewire.doctor.measured_wiring import run_measurement
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.capture.boundaries import Boundaries
from eaglewire.errors import EaglewireError


@pytest.fixture(scope="module")
def dump(target, bounds, tmp_path_factory):  # noqa: F811
    return save_boundaries(
        bounds,
        tmp_path_factory.mktemp("dump") / "b.safetensors",
        target.identity,
        chat_template_sha256=target.chat_template_sha256,
    )


def test_the_dump_round_trips_bit_exactly(tmp_path, target, bounds, dump):  # noqa: F811
    again, identity = load_boundaries(dump)
    assert identity == target.identity
    for name in ("states", "input_ids", "labels", "scored"):
        a, b = getattr(bounds, name), getattr(again, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    half = Boundaries(bounds.states.to(torch.bfloat16), bounds.input_ids, bounds.labels, bounds.scored)
    again, _ = load_boundaries(save_boundaries(half, tmp_path / "bf16.safetensors", target.identity))
    assert again.states.dtype == torch.bfloat16 and torch.equal(again.states, half.states)  # the dtype given


@pytest.mark.parametrize("ids", [[0, 2, 4], None])  # the embedding shifted in (error), the healthy export
def test_measuring_on_the_dump_equals_measuring_with_the_target(
    tmp_path,
    target,
    trained,
    bounds,
    dump,  # noqa: F811
    ids,
):
    ins = inspect_dir(_export(tmp_path, trained, "vllm", ids), "vllm")
    m, found = run_measurement(ins, target, bounds, chain_steps=2)
    stand_in = DumpTarget.from_file(dump)
    d, found_d = run_measurement(ins, stand_in, chain_steps=2)  # the stand-in brings its Boundaries
    assert (d.best, d.delivered, d.gap, d.spread, d.tokens, d.tau) == (
        m.best,
        m.delivered,
        m.gap,
        m.spread,
        m.tokens,
        m.tau,
    )
    assert d.scores.keys() == m.scores.keys()
    for taps, s in m.scores.items():
        assert torch.equal(d.scores[taps].nll, s.nll) and torch.equal(d.scores[taps].hit, s.hit), taps
    assert found_d == found and d.best == TRAINED
    if ids:
        assert found[0].level == "error" and f"best from boundaries {list(TRAINED)}" in found[0].what
    else:
        assert found[0].level == "info" and m.delivered == TRAINED
    report = run_checks(ins, stand_in)  # the static checks run against the stand-in; dump_scope says what not
    assert report.errors == run_checks(ins, target).errors
    assert any(f.check == "target" and "skipped" in f.why for f in report.findings)


def test_engine_knobs_on_a_dump_say_the_engine_did_not_run(tmp_path, trained, dump):  # noqa: F811
    from eaglewire.decoding.tree import TreeShape

    ins = inspect_dir(_export(tmp_path, trained, "vllm", [0, 2, 4]), "vllm")
    m, (f,) = run_measurement(ins, DumpTarget.from_file(dump), chain_steps=2, shape=TreeShape(2, 2, 4))
    assert m.engine.skipped and "not run (a boundaries dump holds no target" in f.what, f.what
    assert m.to_dict()["tau"]["best_engine"] is None and m.tau["best"]  # the teacher-forced chain still there


def _damage(src, dst, drop=None, meta=None, **replace):
    tensors = {k: v for k, v in load_file(str(src)).items() if k != drop}
    tensors.update(replace)
    from safetensors import safe_open

    with safe_open(str(src), framework="pt") as f:
        metadata = {**f.metadata(), **(meta or {})}
    save_file(tensors, str(dst), metadata={k: v for k, v in metadata.items() if v is not None})
    return dst


def test_a_damaged_dump_is_refused_by_name(tmp_path, target, dump):  # noqa: F811
    states = load_file(str(dump))["states"]
    cases = {
        "wrong set of tensors": dict(drop="labels"),
        "states are not every boundary": dict(states=states[:-1].clone()),  # L boundaries, not L+1
        "input_ids does not match": dict(input_ids=load_file(str(dump))["input_ids"][:, :-1].clone()),
        "does not say which target": dict(meta={"target": None}),
        "is not a boundaries dump": dict(meta={"format": "eaglewire.capture/1"}),
    }
    for i, (message, how) in enumerate(cases.items()):
        with pytest.raises(EaglewireError, match=message) as err:
            load_dump(_damage(dump, tmp_path / f"{i}.safetensors", **how))
        assert "eaglewire doctor sample" in str(err.value)  # how to fix it
    assert "[9, B, T, 64]" in str(pytest.raises(EaglewireError, load_dump, tmp_path / "1.safetensors").value)
    assert FORMAT in str(pytest.raises(EaglewireError, load_dump, tmp_path / "4.safetensors").value)


def test_a_token_the_dump_does_not_hold_is_never_read(tmp_path, target, trained, bounds):  # noqa: F811
    """A dump of two prompts stands in for the embedding of its own ~45 tokens only: their rows are the
    target's, every other row is NaN, and measuring other tokens with it stops with an error."""
    two = Boundaries(
        bounds.states[:, :2].clone(), bounds.input_ids[:2].clone(), bounds.labels[:2].clone(), bounds.scored[:2].clone()
    )
    stand_in = DumpTarget.from_file(save_boundaries(two, tmp_path / "two.safetensors", target.identity))
    held = torch.unique(two.input_ids)
    emb = stand_in.embedding()
    assert torch.equal(emb[held], target.embedding()[held])
    others = torch.ones(target.vocab_size, dtype=torch.bool)
    others[held] = False
    assert torch.isnan(emb[others]).all() and int(others.sum()) > 100
    ins = inspect_dir(_export(tmp_path, trained, "vllm"), "vllm")
    with pytest.raises(EaglewireError, match="embedding row"):
        run_measurement(ins, stand_in, bounds, chain_steps=2)  # the full Boundaries hold other tokens
    assert run_measurement(ins, stand_in, chain_steps=2)[0] is not None  # its own tokens measure


def test_a_target_whose_layer_0_does_not_read_the_embedding_is_not_dumped(tmp_path, target, monkeypatch):  # noqa: F811
    scaled = target.embed_tokens.weight * 8.0  # as Gemma's sqrt(hidden) scale would look to the draft
    monkeypatch.setattr(target, "embedding", lambda: scaled)
    with pytest.raises(EaglewireError, match="not its embedding lookup"):
        capture_dump(target, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_cli_sample_then_check_on_the_dump(tmp_path, target, trained):  # noqa: F811
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    target.model.save_pretrained(tmp_path / "t")
    out = _export(tmp_path, trained, "vllm", [0, 2, 4])
    r = CliRunner().invoke(app, ["doctor", "sample", "--target", str(tmp_path / "t"), "--out", str(tmp_path / "b")])
    assert r.exit_code == 0 and (tmp_path / "b").is_file(), r.output
    check = ["doctor", str(out), "--engine", "vllm", "--json", "--steps", "2"]
    r = CliRunner().invoke(app, check + ["--boundaries", str(tmp_path / "b")])
    on_dump = json.loads(r.stdout)
    assert r.exit_code == 1 and on_dump["measurement"]["delivered"] == [0, 2, 4], r.output
    assert any(f["check"] == "measured_wiring" and f["level"] == "error" for f in on_dump["findings"])
    r = CliRunner().invoke(app, check + ["--target", str(tmp_path / "t")])
    assert json.loads(r.stdout)["measurement"] == on_dump["measurement"]  # the same figures, to the digit
    r = CliRunner().invoke(app, check + ["--target", str(tmp_path / "t"), "--boundaries", str(tmp_path / "b")])
    assert r.exit_code == 2 and "--target and --boundaries were both given" in r.output
