"""GGUF drafts for tests, made the way users make them: llama.cpp's own converter (convert_hf_to_gguf.py
--target-model-dir, from the vendored source of the llama-cpp-python sdist in the user cache) run on our
exports; and a rewrite that copies a GGUF with some keys or tensors changed (the broken variants).

The converter needs the target's tokenizer (SmolLM2's, from the cached embedded target: the tiny target
here has its 49152-token vocabulary) and imports `sentencepiece` (scripts/llamacpp_build.sh puts it beside the
sources); tests skip where one is missing, and fail so in CI ($EAGLEWIRE_LLAMACPP set).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from eaglewire.export.llamacpp_layout import NEWEST
from eaglewire.target.loader import wrap_model

ENV = os.environ.get("EAGLEWIRE_LLAMACPP")  # set in CI: a missing source or dependency then fails, not skips
ROOT = Path(ENV) if ENV else Path.home() / ".cache" / "eaglewire" / "llamacpp"
LLAMACPP = ROOT / NEWEST / "src"  # the vendored source scripts/llamacpp_build.sh unpacks
DEPS = ROOT / "converter-deps"  # sentencepiece, which the converter imports (scripts/llamacpp_build.sh)
SMOLLM = Path.home() / ".cache/eaglewire/targets/smollm2-135m"
VOCAB = 49152  # SmolLM2's tokenizer: the converter writes the target's vocabulary into the draft


def need_converter() -> None:
    """Skip (fail in CI, $EAGLEWIRE_LLAMACPP set) where the converter or what it reads is missing."""
    missing = [
        what
        for what, ok in (
            (
                f"llama.cpp's source at {LLAMACPP} (bash scripts/llamacpp_build.sh)",
                (LLAMACPP / "convert_hf_to_gguf.py").is_file(),
            ),
            (
                f"the embedded target's tokenizer at {SMOLLM} (eaglewire target info)",
                (SMOLLM / "tokenizer.json").is_file(),
            ),
            (
                f"sentencepiece in {DEPS} (bash scripts/llamacpp_build.sh)",
                (DEPS / "sentencepiece").is_dir() or importlib.util.find_spec("sentencepiece") is not None,
            ),
        )
        if not ok
    ]
    if missing:
        assert not ENV, "missing: " + "; ".join(missing)
        pytest.skip("missing: " + "; ".join(missing))


def tiny_target(out: Path, layers: int = 8, seed: int = 0):
    """A tiny llama target with SmolLM2's vocabulary, saved (with the tokenizer) where the converter reads it."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SMOLLM / f, out / f)
    return wrap_model(model, name="tiny-llama-smollm-vocab")


def convert(export_dir: Path, target_dir: Path, out: Path, *extra: str) -> Path:
    """llama.cpp's converter on an export directory, f32; the contract side file is kept beside the GGUF."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLAMACPP / "gguf-py"), str(DEPS), *sys.path])}
    out.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            sys.executable,
            str(LLAMACPP / "convert_hf_to_gguf.py"),
            str(export_dir),
            "--target-model-dir",
            str(target_dir),
            "--outfile",
            str(out),
            "--outtype",
            "f32",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    side = export_dir / "eaglewire_contract.json"
    if side.is_file():
        shutil.copy(side, out.parent / side.name)
    return out


def rewrite(
    src: Path,
    dst: Path,
    *,
    set_keys: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    tensors: dict[str, np.ndarray] | None = None,
    keep_contract: bool = True,
) -> Path:
    """A copy of GGUF `src` with keys set (same value type as before, or new ints/bools/int lists), keys
    and tensors dropped, tensors replaced; the contract side file beside it copied when asked."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    set_keys, tensors = dict(set_keys or {}), dict(tensors or {})
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, set_keys.pop(key, f.contents()), f.types[0], sub_type=sub)
    for key, val in set_keys.items():  # new keys
        if isinstance(val, bool):
            w.add_key_value(key, val, GGUFValueType.BOOL)
        elif isinstance(val, int):
            w.add_key_value(key, val, GGUFValueType.UINT32)
        else:
            w.add_key_value(key, list(val), GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    for t in r.tensors:
        if t.name in drop:
            continue
        data = tensors.pop(t.name, None)
        if data is None:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    side = src.parent / "eaglewire_contract.json"
    if keep_contract and side.is_file():
        shutil.copy(side, dst.parent / side.name)
    return dst


def need_llama_server() -> None:
    """Skip the calling test module where llama-server is not built; in CI (CI=true) its absence is a failure."""
    from eaglewire.errors import EaglewireError
    from eaglewire.serve.llamacpp import BUILD_HINT, find_llama_server, llamacpp_source

    try:
        llamacpp_source()
        have = find_llama_server() is not None and find_llama_server().is_file()
    except EaglewireError:
        have = False
    if not have:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI must build llama.cpp's llama-server: " + BUILD_HINT)
        pytest.skip("llama.cpp's llama-server is not built: " + BUILD_HINT, allow_module_level=True)
