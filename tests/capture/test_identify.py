"""Wiring probe: names the boundaries an engine delivered, on dumps made by our own engine with wrong taps,
including the two real-world failures (a single state; an embedding tap shifted into the list)."""

import json

import torch
from safetensors.torch import save_file
from tiny import VOCAB, build_draft, build_target

from eaglewire.capture.identify import probe
from eaglewire.decoding.runtime import StaticRuntime

IDS = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))


def _dump(tmp_path, target, taps, name="d.safetensors", with_ids=True):
    rt = StaticRuntime(target, max_len=32)  # what our engine delivers to the draft for these taps
    _, hidden = rt.forward(IDS, torch.arange(10)[None], 0, taps=taps)
    tensors = {"hidden": hidden[0].contiguous()}
    if with_ids:
        tensors["input_ids"] = IDS[0].contiguous()
    save_file(tensors, str(tmp_path / name))
    return tmp_path / name


def test_correct_wiring_is_confirmed(tmp_path):
    target = build_target("llama", layers=8)
    _, contract = build_draft(target, taps=(2, 4, 5))
    res = probe(target, _dump(tmp_path, target, (2, 4, 5)), contract)
    assert res.ok and res.received == [2, 4, 5]


def test_embedding_tap_shifted_in(tmp_path):
    """Real case (b): [embed, l3, l31] delivered to a draft trained on [3, 31, 59] (here [0, 2, 4] vs [2, 4, 7])."""
    target = build_target("llama", layers=8)
    _, contract = build_draft(target, taps=(2, 4, 7))
    res = probe(target, _dump(tmp_path, target, (0, 2, 4)), contract)
    assert not res.ok and res.received == [0, 2, 4]
    assert "received boundaries [0 (embedding), 2, 4]; it was trained on [2, 4, 7]" in res.message


def test_single_state_means_aux_capture_off(tmp_path):
    """Real case (a): one H-wide state instead of three taps."""
    target = build_target("llama", layers=8)
    _, contract = build_draft(target, taps=(2, 4, 7))
    res = probe(target, _dump(tmp_path, target, (8,)), contract)
    assert not res.ok and res.received == [8]
    assert "ONE 64-wide state" in res.message and "skip fc" in res.message


def test_probe_cli_with_ids_option(tmp_path):
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    target = build_target("llama", layers=8)
    target.model.save_pretrained(tmp_path / "t")
    _, contract = build_draft(target, taps=(2, 4, 7))
    (tmp_path / "c.json").write_text(contract.to_json())
    dump = _dump(tmp_path, target, (1, 2, 4), with_ids=False)
    args = [
        "doctor",
        "probe",
        "--dump",
        str(dump),
        "--target",
        str(tmp_path / "t"),
        "--contract",
        str(tmp_path / "c.json"),
        "--ids",
        ",".join(map(str, IDS[0].tolist())),
        "--json",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["received"] == [1, 2, 4]
