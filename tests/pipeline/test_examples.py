"""The GPU run configs in examples/ cannot rot: each loads through the run-config schema, and every command line
written in its header parses with today's command line, the training knobs of its torchrun line equal to the
file's own."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer.main
import yaml

from eaglewire.cli.app import app
from eaglewire.pipeline.config import resolve

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def _command_lines(path: Path) -> list[list[str]]:
    """The eaglewire command lines of a file's header comment, as argument lists ($T, $R filled in)."""
    lines = []
    for line in path.read_text().splitlines():
        text = line.lstrip("# ").replace("$T", "/models/T").replace("$R", "runs/r")
        if text.startswith("eaglewire "):
            lines.append(shlex.split(text)[1:])
        elif text.startswith("torchrun ") and "-m eaglewire.cli" in text:
            lines.append(shlex.split(text.split("-m eaglewire.cli", 1)[1]))
    return lines


def test_there_are_examples_for_one_gpu_and_for_eight():
    names = {p.name for p in EXAMPLES}
    assert {"llama-3.1-8b-1gpu.yaml", "llama-3.1-8b-8gpu.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_loads_through_the_run_config_schema(path):
    cfg = resolve("quick", path, target="/models/Llama-3.1-8B-Instruct")
    raw = yaml.safe_load(path.read_text())
    assert cfg.device == raw["device"] == "cuda"
    assert cfg.train.features == "online"  # an 8B target's offline features would be hundreds of GB
    assert cfg.data.server  # regeneration through a serving engine
    for section, fields in raw.items():  # every value written is the value the run reads
        if isinstance(fields, dict):
            for key, value in fields.items():
                got = getattr(getattr(cfg, section), key)
                assert (list(got) if isinstance(got, tuple) else got) == value, f"{section}.{key}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_command_line_in_an_example_parses(path):
    group = typer.main.get_group(app)
    lines = _command_lines(path)
    assert lines, "an example says how to run it"
    for argv in lines:
        name, rest = argv[0], argv[1:]
        cmd = group.commands[name]
        if hasattr(cmd, "commands") and rest[0] in cmd.commands:  # a group's command: `data regenerate`
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        cmd.make_context(name, list(rest))  # raises on an unknown option or a bad value


def test_the_torchrun_line_trains_with_the_files_own_knobs():
    path = next(p for p in EXAMPLES if p.name == "llama-3.1-8b-8gpu.yaml")
    raw = yaml.safe_load(path.read_text())
    (train,) = [a for a in _command_lines(path) if a[0] == "train"]
    flags = {
        train[i][2:].replace("-", "_"): train[i + 1]
        for i in range(1, len(train) - 1)
        if train[i].startswith("--") and not train[i + 1].startswith("--")
    }
    for key, value in raw["train"].items():
        if key == "features":  # online is `--data`; offline would be `--features DIR`
            assert "data" in flags
            continue
        assert key in flags, f"train.{key} is not on the torchrun line"
        assert type(value)(flags[key]) == value, f"train.{key}"
    assert int(flags["max_length"]) == raw["data"]["max_length"]
    assert flags["device"] == raw["device"]
    (vocab,) = [a for a in _command_lines(path) if a[:2] == ["vocab", "build"]]
    assert vocab[vocab.index("--draft-vocab-size") + 1] == str(raw["vocab"]["draft_vocab_size"])
