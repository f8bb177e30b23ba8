"""Runs inside the speculators venv: load an eaglewire vLLM/speculators export with speculators' own loader
(SpeculatorModel.from_pretrained resolves the class from the config's registry) and write it again with
speculators' own writer (save_pretrained: config.json and weights), so a test can serve a speculators-written
export in vLLM. Prints what was loaded and written as JSON."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the verifier named in the export is a local directory

import torch  # noqa: E402
from speculators import SpeculatorModel  # noqa: E402

src, out = sys.argv[1], Path(sys.argv[2])
model = SpeculatorModel.from_pretrained(src)
model.save_pretrained(out)
print(
    json.dumps(
        {
            "class": type(model).__name__,
            "files": sorted(p.name for p in out.iterdir()),
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "layer_ids": model.config.eagle_aux_hidden_state_layer_ids,
            "vocab_mapped": bool(model.t2d is not None and torch.any(model.t2d)),
        }
    )
)
