"""Our GGUF draft is what llama.cpp's own converter writes from our vLLM (EAGLE-3) or z-lab (DFlash) export of the same
draft: same arch, target_layers, norms, block size, mask token, hyperparameters and vocabulary, same tensor names,
shapes, types and values. The converter runs from the vendored source of the newest llama.cpp read, with its own
gguf-py, on the embedded target's HF folder; a small random draft keeps it quick. And the seeds' failure, in
llama.cpp: the converter reads a nested (SGLang) config's ids as absent and writes [2, n//2, n-3] silently.

Locally this skips without the source (scripts/llamacpp_build.sh); with $EAGLEWIRE_LLAMACPP set (CI) it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from eaglewire.contract import default_taps, to_engine
from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.convert import export_draft

ENV = os.environ.get("EAGLEWIRE_LLAMACPP")
ROOT = Path(ENV) if ENV else Path.home() / ".cache" / "eaglewire" / "llamacpp"
SRC = ROOT / lay.NEWEST / "src"
DEPS = ROOT / "converter-deps"  # sentencepiece, which the converter imports (scripts/llamacpp_build.sh)
if not ENV and not (SRC / "convert_hf_to_gguf.py").is_file():
    pytest.skip("llama.cpp's source is not unpacked: bash scripts/llamacpp_build.sh", allow_module_level=True)
pytestmark = pytest.mark.real_target
COSMETIC = {"general.name", "general.size_label", "general.type"}  # labels, not read by llama.cpp's loaders
DEFAULTS = {"dflash.attention.causal": False}  # common/speculative.cpp: causal_attn = false unless the key says


def convert(args: list[str]) -> None:
    assert (SRC / "convert_hf_to_gguf.py").is_file(), (
        f"llama.cpp {lay.NEWEST} is not at {SRC}: run bash scripts/llamacpp_build.sh"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC / "gguf-py"), str(DEPS)])}
    r = subprocess.run(
        [sys.executable, "convert_hf_to_gguf.py", *args], cwd=SRC, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"llama.cpp's converter failed (sentencepiece in {DEPS}?):\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def target():
    from eaglewire.target.weights import load_target_weights

    return load_target_weights(None)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, target) -> Path:
    """The target's vocabulary as llama.cpp's converter writes it (what a served target GGUF carries)."""
    out = tmp_path_factory.mktemp("vocab") / "target-vocab.gguf"
    convert([str(target.path), "--vocab-only", "--outfile", str(out)])
    return out


def read(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.") and k not in COSMETIC}
    return {**DEFAULTS, **kv}, {
        t.name: (t.tensor_type.name, [int(n) for n in t.shape], np.array(t.data)) for t in r.tensors
    }


def assert_same_gguf(ours: Path, theirs: Path) -> None:
    (a, ta), (b, tb) = read(ours), read(theirs)
    diff = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert not diff, f"metadata that differs (ours, llama.cpp's converter): {diff}"
    assert ta.keys() == tb.keys(), f"tensors only ours: {ta.keys() - tb.keys()}, only theirs: {tb.keys() - ta.keys()}"
    for name, (kind, shape, data) in ta.items():
        assert (kind, shape) == tb[name][:2], f"{name}: ours {kind} {shape}, theirs {tb[name][:2]}"
        assert np.array_equal(data, tb[name][2]), f"{name}: values differ"


def _eagle3(target, taps):
    from eaglewire.draft.config import DraftConfig
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.draft.vocab import VocabMap

    vmap = VocabMap.from_target_ids(torch.arange(0, 2 * 512, 2), target.vocab_size)
    contract = target.contract(taps, vocab_map=vmap)
    draft = Eagle3Draft(DraftConfig.from_target(target.text_config, contract)).init_random(3)
    draft.d2t.copy_(vmap.d2t)
    draft.t2d.copy_(vmap.t2d)
    return draft, contract


def test_eagle3_gguf_equals_the_converters(tmp_path, target, vocab):
    draft, contract = _eagle3(target, (1, 9, 20))  # not the default taps: the ids must travel
    vllm = export_draft(draft, contract, tmp_path / "vllm", "vllm")
    convert(
        [
            str(vllm),
            "--target-model-dir",
            str(target.path),
            "--outfile",
            str(tmp_path / "theirs.gguf"),
            "--outtype",
            "f32",
        ]
    )
    ours = export_draft(draft, contract, tmp_path / "ours", "llamacpp", vocab_from=vocab)
    assert_same_gguf(ours / lay.GGUF_FILE, tmp_path / "theirs.gguf")


def test_dflash_gguf_equals_the_converters(tmp_path, target, vocab):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.families import BlockWiring

    contract = dflash_contract(target, (2, 9, 15, 21, 28), BlockWiring(8, target.vocab_size - 1))
    draft = build_dflash_draft(target, contract, 2, seed=1)
    zlab = export_draft(draft, contract, tmp_path / "zlab", "zlab")
    convert(
        [
            str(zlab),
            "--target-model-dir",
            str(target.path),
            "--outfile",
            str(tmp_path / "theirs.gguf"),
            "--outtype",
            "f32",
        ]
    )
    ours = export_draft(draft, contract, tmp_path / "ours", "llamacpp", vocab_from=vocab)
    assert_same_gguf(ours / lay.GGUF_FILE, tmp_path / "theirs.gguf")


def test_the_converter_loses_an_sglang_exports_ids(tmp_path, target):
    """The issue's silent failure: SGLang's nested eagle_config is not read; the converter writes its default."""
    draft, contract = _eagle3(target, (1, 9, 20))
    sglang = export_draft(draft, contract, tmp_path / "sglang", "sglang")
    convert(
        [
            str(sglang),
            "--target-model-dir",
            str(target.path),
            "--outfile",
            str(tmp_path / "lost.gguf"),
            "--outtype",
            "f32",
        ]
    )
    kv, _ = read(tmp_path / "lost.gguf")
    L = target.num_layers
    assert kv["eagle3.target_layers"] == list(to_engine(default_taps(L), "llamacpp", L))
    assert kv["eagle3.target_layers"] != list(contract.engine_ids("llamacpp"))
