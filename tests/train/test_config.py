"""Each training knob is defined once (train/config.py) and the two places users set knobs derive from it:
`eaglewire train`'s options and the run config's `train` section. These tests fail when a knob is declared
in only one place, declared a second time by hand, or when a flag or run-config key changes."""

import typing

import pytest
import typer
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.pipeline.config import RunConfig, TrainCfg, resolve
from eaglewire.train.config import TrainConfig, knob_fields

# `eaglewire train`'s options that are not training knobs (data, target, run directory); any other
# option must come from a TrainConfig field
NOT_KNOBS = {
    "data",
    "features",
    "vocab",
    "out",
    "target",
    "taps",
    "taps_from",
    "max_length",
    "limit",
    "heldout_fraction",
    "train_limit",
    "split_turns",
    "also_features",
    "resume",
    "device",
}
RUN_ONLY = {"features", "capture_dtype", "heldout_fraction"}  # the run config's own train-section fields

# the flags and run-config keys users have scripts and YAML files for: renaming or dropping one breaks them
# (a new knob adds to them)
CLI_FLAGS = {
    "--max-steps": 300,
    "--batch-size": 4,
    "--grad-accum": 1,
    "--lr": 1e-3,
    "--warmup-steps": 20,
    "--ttt-steps": 7,
    "--ttt-decay": 0.8,
    "--round-weight": 0.0,
    "--feature-weight": 0.0,
    "--loss": "soft_ce",
    "--supervise": "answers",
    "--num-layers": 1,
    "--init-layers-from-target": False,
    "--eval-every": 50,
    "--ckpt-every": 100,
    "--seed": 0,
    "--dtype": "auto",
    "--snapshot-steps": "",
    "--init-from": None,
    "--train-only": "",
    "--norms": "auto",
    "--optimizer": "adamw",
}
RUN_KEYS = {
    "features",
    "capture_dtype",
    "max_steps",
    "batch_size",
    "lr",
    "warmup_steps",
    "ttt_steps",
    "ttt_decay",
    "loss",
    "supervise",
    "num_layers",
    "eval_every",
    "ckpt_every",
    "heldout_fraction",
    "seed",
    "dtype",
    "init_from",
    "norms",
    "optimizer",
}


def _train_options() -> dict:
    cmd = typer.main.get_command(app).commands["train"]
    return {p.name: p for p in cmd.params}


def _cli_default(field) -> object:
    """A knob's default as its option shows it: a tuple as a comma list, a path '' as no path."""
    d = field.default
    if isinstance(d, tuple):
        return ",".join(map(str, d))
    extra = field.json_schema_extra or {}
    return None if extra.get("path") and d == "" else d


def test_every_knob_is_declared_with_a_description_and_where_it_is_set():
    for name, field in TrainConfig.__pydantic_fields__.items():
        assert field.description, name
        assert {"cli", "run"} <= set(field.json_schema_extra), f"{name}: declare it with knob()"


def test_cli_options_are_the_cli_knobs_with_their_defaults_and_descriptions():
    options = _train_options()
    fields = TrainConfig.__pydantic_fields__
    cli = {n for n, f in fields.items() if f.json_schema_extra["cli"]}
    assert set(options) - NOT_KNOBS == cli  # no knob missing, none hand-written beside the generated ones
    for name in cli:
        opt, field = options[name], fields[name]
        assert opt.opts == ["--" + name.replace("_", "-")]
        assert opt.default == _cli_default(field), name
        assert field.description[1:] in opt.help, name


def test_flags_and_their_defaults_are_unchanged():
    options = {p.opts[0]: p.default for n, p in _train_options().items() if n not in NOT_KNOBS}
    assert CLI_FLAGS.items() <= options.items()


def test_run_config_train_section_is_the_run_knobs():
    fields = TrainConfig.__pydantic_fields__
    run = {n for n, f in fields.items() if f.json_schema_extra["run"]}
    assert set(TrainCfg.model_fields) == run | RUN_ONLY
    assert RUN_KEYS <= set(TrainCfg.model_fields)
    for name in run:
        mine, theirs = TrainCfg.model_fields[name], fields[name]
        assert (mine.default, mine.description, mine.metadata) == (
            theirs.default,
            theirs.description,
            theirs.metadata,
        ), name
        choices = theirs.json_schema_extra.get("choices")
        if choices:
            assert typing.get_args(mine.annotation) == tuple(choices), name
    assert TrainCfg().train_config() == TrainConfig()


def test_a_run_config_key_reaches_the_training_config():
    cfg = resolve("quick").model_dump()
    cfg["train"].update(max_steps=7, loss="forward_kl", init_from="")
    t = RunConfig.model_validate(cfg).train.train_config()
    assert (t.max_steps, t.loss, t.ttt_steps) == (7, "forward_kl", 3)
    with pytest.raises(Exception, match="train.max_steps"):
        resolve("quick", train={"max_steps": 0})


def test_cli_values_reach_the_training_config(monkeypatch, tmp_path):
    import eaglewire.cli.train as cli_train

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        return TrainConfig(**kwargs)

    monkeypatch.setattr(cli_train, "TrainConfig", record)
    # neither --data nor --features: the command stops right after building the config, before loading anything
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--vocab",
            "v",
            "--out",
            str(tmp_path),
            "--max-steps",
            "5",
            "--loss",
            "nla",
            "--snapshot-steps",
            "2,4",
            "--init-from",
            "a/draft",
            "--init-layers-from-target",
        ],
    )
    assert r.exit_code == 2 and "exactly one data source" in r.output, r.output
    assert set(seen) == set(knob_fields("cli"))
    assert (
        seen["max_steps"],
        seen["loss"],
        seen["snapshot_steps"],
        seen["init_from"],
        seen["init_layers_from_target"],
        seen["lr"],
    ) == (5, "nla", (2, 4), "a/draft", True, 1e-3)


@pytest.mark.parametrize(
    "args, named",
    [
        (["--max-steps", "0"], "--max-steps"),
        (["--loss", "tv"], "--loss"),
        (["--train-only", "neck"], "--train-only"),
        (["--lr", "0"], "--lr"),
    ],
)
def test_cli_refuses_values_outside_a_knobs_bounds_or_choices(tmp_path, args, named):
    r = CliRunner().invoke(app, ["train", "--vocab", "v", "--out", str(tmp_path), "--data", "d", *args])
    assert r.exit_code == 2 and named in r.output and "invalid option value" in r.output, r.output
