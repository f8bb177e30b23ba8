"""`eaglewire run --family dflash` starts from DFlash's best measured recipe (train/objectives.py run_defaults),
a config file or flag still wins, an EAGLE-3 run is unchanged, and `--show-config` prints no field the family
never reads."""

from __future__ import annotations

import json

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.pipeline.budgets import BUDGETS
from eaglewire.pipeline.config import resolve
from eaglewire.train.objectives import objective


def _shown(*args: str) -> dict:
    r = CliRunner().invoke(app, ["run", *args, "--show-config"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_dflash_defaults_are_the_best_measured_recipe():
    d = _shown("--family", "dflash")
    assert {k: d["family"][k] for k in ("name", "block_size", "anchors", "init_from_target", "reduced_vocab")} == {
        "name": "dflash",
        "block_size": 4,
        "anchors": 64,
        "init_from_target": True,
        "reduced_vocab": True,
    }
    assert d["train"]["lr"] == 3e-3 and d["train"]["init_from"] == "" and d["vocab"]["draft_vocab_size"] == 16000
    assert d["bench"]["methods"] == ["vanilla", "dflash"] and d["formats"] == ["vllm"]  # its own head: vLLM reads it
    for dotted in ("train.ttt_steps", "train.ttt_decay", "bench.num_steps", "bench.topk", "bench.num_draft_tokens"):
        section, key = dotted.split(".")
        assert key not in d[section], dotted  # EAGLE-3-only fields are not shown for a DFlash run


def test_an_eagle3_run_is_unchanged_and_shows_every_field():
    d = _shown()
    assert d["family"]["name"] == "eagle3" and not d["family"]["reduced_vocab"] and d["train"]["ttt_steps"] == 3
    assert resolve("quick").model_dump() == resolve("quick", family={"name": "eagle3"}).model_dump()


@settings(max_examples=15, deadline=None)
@given(
    budget=st.sampled_from(sorted(BUDGETS)), lr=st.floats(1e-5, 1e-1), block=st.integers(2, 16), via_file=st.booleans()
)
def test_the_config_file_and_flags_win_over_the_family_defaults(tmp_path_factory, budget, lr, block, via_file):
    """Whichever budget: the family's defaults replace the budget's fields, a file's fields replace those."""
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    family = {"block_size": block, **({"name": "dflash"} if via_file else {})}
    path.write_text(yaml.safe_dump({"train": {"lr": lr}, "family": family}))
    cfg = resolve(budget, path, family=None if via_file else {"name": "dflash"})
    assert cfg.family.name == "dflash" and cfg.family.block_size == block and cfg.train.lr == lr
    assert cfg.family.anchors == objective("dflash").run_defaults["family"]["anchors"]
    assert cfg.vocab.draft_vocab_size == objective("dflash").run_defaults["vocab"]["draft_vocab_size"]
