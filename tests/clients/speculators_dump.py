"""Runs inside the speculators venv: write a speculators Arrow dataset with `datasets.save_to_disk` (what
`speculators prepare-data` does, speculators/cli/prepare_data.py; columns as data_generation/preprocessing.py
`_append_row` builds them), then read every row back through speculators' own training dataset
(speculators/train/data.py ArrowDataset, hidden states from DIR/hidden_states/hs_{row}.safetensors) and save
what training would get, so the test can compare it with our reader."""

import json
import sys

import torch
from datasets import Dataset
from safetensors.torch import save_file
from speculators.train.data import ArrowDataset

data_dir, rows_file, out_file = sys.argv[1], sys.argv[2], sys.argv[3]
rows = json.loads(open(rows_file).read())
ds = Dataset.from_dict(
    {
        "input_ids": [r["input_ids"] for r in rows],
        "loss_mask": [r["loss_mask"] for r in rows],
        "seq_len": [len(r["input_ids"]) for r in rows],
    }
)
ds.set_format(type="torch")
ds.save_to_disk(data_dir)
train = ArrowDataset(max_len=4096, datapath=data_dir, on_missing="skip")
tensors = {}
for i in range(len(train)):
    item = train[i]
    if not isinstance(item, dict):
        continue  # SampleUnavailable: no hidden states for this row
    for key in ("input_ids", "loss_mask", "hidden_states", "verifier_last_hidden_states"):
        tensors[f"{i}|{key}"] = torch.as_tensor(item[key]).contiguous()
save_file(tensors, out_file)
print(len(tensors))
