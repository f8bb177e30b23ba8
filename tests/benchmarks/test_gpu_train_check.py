"""benchmarks/gpu_train_check.py, the whole-job GPU check, on a machine without a GPU: it imports, refuses at
once with a message that says why and what to do, and the small target it builds (nothing downloaded) loads as
an eaglewire target with a chat template, so the pipeline can regenerate with it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_train_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_train_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_train_check"] = module
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_refuses_at_once_and_says_why(monkeypatch, capsys, tmp_path):
    check = _module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as stop:
        check.main(["--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu" in err and "docs/guides/gpu.md" in err
    assert not out.exists()  # no JSON that could be mistaken for a result


def test_the_small_target_it_builds_loads_with_a_chat_template(tmp_path):
    from eaglewire.target.loader import load_target

    check = _module()
    path = check.build_small_target(tmp_path / "t", hidden=64, layers=8)
    target = load_target(str(path))
    ids = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "héllo"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert target.num_layers == 8 and target.chat_template is not None
    assert target.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert "héllo" in target.tokenizer.decode(ids)  # byte-level: any text round-trips


def test_every_part_it_runs_is_named_in_its_usage():
    check = _module()
    a = check.parse([])
    assert set(a.parts.split(",")) == {"job", "lossless", "checks", "throughput"}
    assert set(check.GPU_STAGES) <= {"regenerate", "features", "train", "bench"}
