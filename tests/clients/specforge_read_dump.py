"""Runs inside the SpecForge venv: read a SpecForge offline dump with SpecForge's own file lister and loader
(runtime/data_plane/offline_reader.py list_feature_files, feature_store.py load_feature_file) and save what
it got, so the test can check that our writer helper and our reader agree with SpecForge's reading."""

import sys

from safetensors.torch import save_file
from specforge.runtime.data_plane.feature_store import load_feature_file
from specforge.runtime.data_plane.offline_reader import list_feature_files

dump_dir, out_file = sys.argv[1], sys.argv[2]
tensors = {}
for path in list_feature_files(dump_dir):
    raw = load_feature_file(path)  # SpecForge's loader (weights_only=False: trusted test files only)
    name = path[len(dump_dir) :].lstrip("/")
    for key in ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state"):
        tensors[f"{name}|{key}"] = raw[key].contiguous()
save_file(tensors, out_file)
print(len(tensors))
