"""Targets: the atomic cache, clear errors for bad paths, and a local HF directory as a target."""

import json

import pytest
from tiny import build_model

from eaglewire.cache import MARKER, ensure_dir, is_complete
from eaglewire.errors import TargetError
from eaglewire.target.loader import load_target, resolve_target


def _builder(calls):
    def build(tmp):
        calls.append(tmp)
        (tmp / "model.safetensors").write_bytes(b"x" * 100)
        (tmp / "config.json").write_text("{}")

    return build


def test_cache_built_once_then_reused(tmp_path):
    calls = []
    path, built = ensure_dir(tmp_path / "t", {"v": 1}, _builder(calls))
    assert built and is_complete(path, {"v": 1})
    path, built = ensure_dir(tmp_path / "t", {"v": 1}, _builder(calls))
    assert not built and len(calls) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no temp dirs left behind


def test_half_written_cache_is_rebuilt(tmp_path):
    """A conversion killed before completion leaves no marker; it is detected and rebuilt, never used."""
    half = tmp_path / "t"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"x" * 10)  # truncated, no marker
    calls = []
    path, built = ensure_dir(half, {"v": 1}, _builder(calls))
    assert built and (path / "model.safetensors").stat().st_size == 100


def test_truncated_file_after_completion_is_rebuilt(tmp_path):
    calls = []
    path, _ = ensure_dir(tmp_path / "t", {"v": 1}, _builder(calls))
    (path / "model.safetensors").write_bytes(b"x")  # damaged after the fact
    assert not is_complete(path, {"v": 1})
    _, built = ensure_dir(path, {"v": 1}, _builder(calls))
    assert built and len(calls) == 2
    _, built = ensure_dir(path, {"v": 2}, _builder(calls))  # another source file -> rebuilt too
    assert built


def test_killed_build_leaves_nothing(tmp_path):
    def dies(tmp):
        (tmp / "model.safetensors").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_dir(tmp_path / "t", {"v": 1}, dies)
    assert list(tmp_path.iterdir()) == []


def test_missing_path_and_non_model_dir(tmp_path):
    with pytest.raises(TargetError, match="does not exist") as err:
        resolve_target(str(tmp_path / "nope"))
    assert "smollm2-135m" in str(err.value)
    with pytest.raises(TargetError, match="not a HF model directory") as err:
        resolve_target(str(tmp_path))
    assert "config.json" in str(err.value)


def test_unloadable_model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_arch"}))
    with pytest.raises(TargetError, match="cannot load target") as err:
        load_target(str(tmp_path), with_tokenizer=False)
    assert "no_such_arch" in str(err.value)


def test_local_hf_directory_is_a_target(tmp_path):
    build_model("qwen3").save_pretrained(tmp_path / "q3")
    target = load_target(str(tmp_path / "q3"), with_tokenizer=False)
    info = target.info()
    assert info["architecture"] == "Qwen3ForCausalLM" and info["num_layers"] == 4 and info["hidden_size"] == 64
    assert info["has_chat_template"] is False


def test_marker_is_last_file_written(tmp_path):
    path, _ = ensure_dir(tmp_path / "t", {"v": 1}, _builder([]))
    meta = json.loads((path / MARKER).read_text())
    assert meta["files"] == {"config.json": 2, "model.safetensors": 100}
