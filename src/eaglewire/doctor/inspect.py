"""What the doctor looks at: an exported (or native) draft directory, read without trusting it.

Nothing here raises on a broken draft: every oddity becomes data the checks turn into findings. What
each engine reads is its record in eaglewire/export/engines.py (shared with the exporters and importers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract
from eaglewire.export.engines import Engine, engine_for
from eaglewire.errors import EaglewireError
from eaglewire.doctor.config_types import check_config_types
from eaglewire.export.base import CONTRACT_FILE, read_contract, read_draft_config
from eaglewire.export.convert import detect_engine
from eaglewire.safeio import about_file, open_safetensors


@dataclass
class Inspection:
    directory: Path
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    small: dict[str, torch.Tensor]  # d2t, t2d (read fully)
    contract: WiringContract | None
    contract_source: str  # "side file", "native config", "none"
    engine: Engine  # how the engine it is checked for loads it
    notes: list[str] = field(default_factory=list)

    @property
    def is_speculators(self) -> bool:
        return "speculators_model_type" in self.config

    @property
    def layer_config(self) -> dict[str, Any]:
        return (
            self.config.get("transformer_layer_config", self.config)
            if self.is_speculators
            else self.config.get("draft", self.config)
        )

    def get(self, dotted: str) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def inspect_dir(directory: Path, engine: str | None, engine_version: str | None = None) -> Inspection:
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise EaglewireError(
            f"{directory} has no config.json",
            expected="a draft directory",
            found="no config.json",
            fix="point the doctor at the exported draft directory",
        )
    config = read_draft_config(cfg_path)  # the values import refuses, the doctor refuses too
    name = engine or detect_engine(config)
    record = engine_for(name, engine_version)
    check_config_types(config, cfg_path, record.id_keys)
    shapes, dtypes, small = {}, {}, {}
    weights = directory / "model.safetensors"
    if weights.is_file():
        with open_safetensors(weights, what="draft weights") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                shapes[k], dtypes[k] = tuple(sl.get_shape()), sl.get_dtype()
                if k in ("d2t", "t2d"):
                    small[k] = f.get_tensor(k)
    contract, source = None, "none"
    if (directory / CONTRACT_FILE).is_file():
        contract, source = read_contract(directory), "side file"
    elif "contract" in config and config.get("format") == "eaglewire.draft/1":
        with about_file(cfg_path):
            contract, source = WiringContract.from_dict(config["contract"]), "native config"
    return Inspection(directory, config, shapes, dtypes, small, contract, source, record)
