"""A real client checks our exports: the `speculators` package (vLLM's format owner) loads our vLLM export
with its own Eagle3DraftModel and computes the same logits as eaglewire.

speculators needs transformers <= 5.19, so it lives in a second venv made by scripts/speculators_venv.sh;
.ci/run creates it and sets EAGLEWIRE_SPECULATORS_PYTHON. SGLang cannot be installed here (CUDA-only
wheel pinning another torch) and SpecForge's training wrapper imports triton; their layouts are checked
against their loaders' code in tests/test_formats.py and tests/test_doctor.py instead.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny import build_draft, build_target

from eaglewire.contract import NormFlags
from eaglewire.formats.convert import export_draft

PY = os.environ.get("EAGLEWIRE_SPECULATORS_PYTHON")
pytestmark = pytest.mark.skipif(not PY, reason="set EAGLEWIRE_SPECULATORS_PYTHON (scripts/speculators_venv.sh)")


@pytest.mark.parametrize("norm", [NormFlags(), NormFlags(norm_before_fc=True, norm_before_residual=True)],
                         ids=["eagle3", "eagle3.1-norms"])
def test_speculators_loads_our_vllm_export_with_equal_logits(tmp_path, norm):
    target = build_target("llama", layers=8)
    target.model.save_pretrained(tmp_path / "target")  # speculators reads the verifier's config from here
    draft, contract = build_draft(target, taps=(2, 4, 5), seed=3, norm=norm)
    export_draft(draft, contract, tmp_path / "export", "vllm", with_embedding=True, verifier=str(tmp_path / "target"))
    g = torch.Generator().manual_seed(0)
    ids, taps = torch.randint(0, 256, (1, 12), generator=g), torch.randn(1, 12, 3 * 64, generator=g)
    with torch.no_grad():
        logits = draft(ids, taps).logits
    save_file({"ids": ids, "taps": taps, "logits": logits}, str(tmp_path / "io.safetensors"))
    script = Path(__file__).parent / "clients" / "speculators_logits.py"
    out = subprocess.run([PY, str(script), str(tmp_path / "export"), str(tmp_path / "io.safetensors")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["layer_ids"] == [2, 4, 5]  # vLLM's convention, read from the top-level key
    assert result["max_abs_diff"] < 1e-4 * max(1.0, result["scale"]), result
