"""What the doctor reads of a block drafter's directory (DFlash, DFlash2, DSpark): its family, the layout its
tool wrote, the fields each engine reads, the engine rule that applies (block_rules.json, keyed by engine and
version; the boundaries the engine then captures are block_delivery.py's), read without trusting the files: an
oddity becomes data for block_checks.py, never an exception.

Layouts (which tool wrote the config, and how that tool numbers the taps it trained on):

    zlab         z-lab's HF layout (SpecForge writes the same): DFlashDraftModel, top-level block_size,
                 dflash_config {mask_token_id, target_layer_ids}; id k = output of layer k (convention zlab)
    sglang       the same, with block_size inside dflash_config (edited for SGLang's parse_dflash_draft_config)
    vllm-edited  the same, with the eagle_aux_hidden_state_layer_ids that vLLM's speculators updater writes
    speculators  speculators' config (speculators_model_type dflash / dflash2 / dspark): aux_hidden_state_layer_ids
                 are HF indices (capture entering layer k = boundary k), transformer_layer_config
    deepspec     DeepSpec's Qwen3DSparkModel: top-level target_layer_ids (block-k, -1 = the embedding),
                 markov_rank 0 = its "dflash" configs, > 0 = DSpark
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract, from_engine
from eaglewire.errors import EaglewireError, TranslationError
from eaglewire.export.base import CONTRACT_FILE, read_contract
from eaglewire.export.engines import engine_field, engine_for
from eaglewire.safeio import open_safetensors, read_json_object
from eaglewire.target.protocol import TargetInfo

RULES_FILE = Path(__file__).with_name("block_rules.json")
SPECULATORS_TYPES = {"dflash": "dflash", "dflash2": "dflash2", "dspark": "dspark"}
HF_ARCHS = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
DEEPSPEC_ARCH = "Qwen3DSparkModel"


@dataclass(frozen=True)
class ReadFamily:
    """What the doctor needs of a block-drafter family it reads (eaglewire trains DFlash only; its wiring record
    is families.py's): the checks ask this record, never the family's name."""

    anchor_first: bool  # slot 0 drafts (DSpark: num_speculative_tokens = B) or is the anchor (DFlash: B - 1)
    vllm_causal_override: bool  # vLLM loads it through update_dflash: sliding_window_non_causal -> causal, all layers
    vllm_anchor_default_differs: bool  # vLLM's sample_from_anchor default is not its writer's (update_dspark)
    full_vocab_selector: bool = False  # a candidate selector over the full vocabulary (DFlash2): no d2t allowed,
    # and on vLLM it runs only on the V2 model runner
    backbone_heads: tuple[str, ...] | None = None  # weights beside the DFlash backbone that the measured wiring
    # sets aside (DSpark's Markov and confidence heads bias the backbone's logits); None: no backbone eaglewire
    # computes (DFlash2 drafts through its candidate selector), so the taps are not measured

    def anchor_layout(self, config: dict[str, Any]) -> str:
        """The anchor layout the draft was trained in (families.py ANCHOR_LAYOUTS): an anchor-first family's
        writer records it as sample_from_anchor (speculators' DSpark default: true, slot k predicts p+k+1);
        DFlash's is always the bonus layout (slot 0 is the anchor)."""
        if not self.anchor_first:
            return "bonus"
        return "bonus" if config.get("sample_from_anchor", True) is False else "anchor_first"


READ_FAMILIES = {
    "dflash": ReadFamily(False, True, False, backbone_heads=()),
    "dflash2": ReadFamily(False, True, False, True),
    "dspark": ReadFamily(True, False, True, backbone_heads=("markov_head.", "confidence_head.")),
}
# the export format (export/block.py DFLASH_FORMATS) that reads each layout's fields, for the measurement's loader;
# DeepSpec's layout has none
LAYOUT_FORMATS = {"zlab": "zlab", "sglang": "sglang", "vllm-edited": "zlab", "speculators": "vllm"}
# the engine record's row (export/engines.py) whose numbering each layout's writer meant: SGLang's and vLLM-edited
# z-lab configs are written the way z-lab's reference reads them; DeepSpec writes z-lab's ids at the top level
LAYOUT_IDS = {
    "zlab": ("zlab", "zlab"),
    "sglang": ("zlab", "zlab"),
    "vllm-edited": ("zlab", "zlab"),
    "speculators": ("vllm", "speculators"),
}
# DeepSpec is a writer, not an engine: z-lab's ids at the top level, -1 for the embedding (contract: deepspec)
DEEPSPEC_IDS = ("target_layer_ids", "deepspec")


def field_convention(engine: str, at: str) -> str:
    """The convention `engine`'s record reads block-drafter ids in at config field `at` (export/engines.py)."""
    return next(f.convention for f in engine_for(engine, family="dflash").fields("dflash") if f.field == at)


def layout_ids(layout: str) -> tuple[str, str]:
    """(the field a layout keeps its tap ids in, the convention its writer numbers them in)."""
    if layout == "deepspec":
        return DEEPSPEC_IDS
    row = engine_field(*LAYOUT_IDS[layout], "dflash")
    return row.field, row.convention


@lru_cache(maxsize=1)
def rules() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(RULES_FILE.read_text())
    return table


def _release(version: str) -> tuple[int, ...] | None:
    """A release number's numeric parts ("0.30.0" -> (0, 30, 0), "0.30" -> (0, 30)); None for anything else."""
    parts = version.strip().lstrip("v").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def _range_row(engine: str, version: str, rows: dict[str, Any]) -> str | None:
    """The row a release of a ranged engine falls in: the newest row keyed at or before it (rows are keyed by the
    first release with their behaviour). Refuses a release before the oldest row or after the newest read."""
    asked = _release(version)
    if asked is None:
        return None
    keyed = sorted(((_release(k) or (), k) for k in rows), reverse=True)
    newest, oldest = keyed[0], keyed[-1]
    if asked[: len(newest[0])] > newest[0]:
        raise EaglewireError(
            f"{engine} {version} is newer than the newest release whose block-drafter rules "
            f"eaglewire has read ({newest[1]})",
            expected=f"a release up to {newest[1]}",
            found=version,
            fix=f"pass --engine-version {newest[1]} to apply the newest rules read, "
            "and check the engine's changelog for DFlash changes since",
        )
    for key, name in keyed:
        if asked >= key:
            return name
    raise EaglewireError(
        f"{engine} {version} is not a version whose block-drafter rules eaglewire has read: "
        f"block drafters arrived in {engine} {oldest[1]}",
        expected=f"a release from {oldest[1]}",
        found=version,
        fix=f"upgrade {engine} to {oldest[1]} or later",
    )


def engine_rule(engine: str, version: str | None) -> tuple[str, dict[str, Any]]:
    """The (version, row) of block_rules.json that applies: `version`, or the engine's newest row. A ranged engine
    (vLLM) takes a release number and applies the row it falls in (the version then says so: "0.30.0 (rules of
    0.29)"), or a named alias (before-pr40727)."""
    rows = rules().get(engine)
    if rows is None:
        raise EaglewireError(
            f"the doctor has no block-drafter rules for engine {engine!r}",
            expected=" or ".join(k for k in rules() if not k.startswith("_")),
            found=engine,
            fix="check a block drafter with --engine vllm or --engine sglang",
        )
    version = version or next(iter(rows))
    if version in rows:
        return version, rows[version]
    alias = rules().get("_aliases", {}).get(engine, {}).get(version)
    key = alias or (_range_row(engine, version, rows) if engine in rules().get("_ranges", ()) else None)
    if key is None:
        aliases = ", ".join(rules().get("_aliases", {}).get(engine, {}))
        raise EaglewireError(
            f"{engine} {version} is not a version whose block-drafter rules eaglewire has read",
            expected=", ".join(rows) + (f" (or a release number between them; aliases: {aliases})" if aliases else ""),
            found=version,
            fix="pass the engine's release number (e.g. --engine-version "
            f"{next(iter(rows))}), or pick the listed version closest to yours",
        )
    asked, row = _release(version) or (), _release(key) or ()
    width = max(len(asked), len(row))
    same = asked + (0,) * (width - len(asked)) == row + (0,) * (width - len(row))  # "0.29.0" is the "0.29" row
    return (version if alias or same else f"{version} (rules of {key})"), rows[key]


def get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def block_layout(config: dict[str, Any]) -> tuple[str, str] | None:
    """(family, layout) of a block drafter's config; None for anything else (EAGLE-3 drafts keep their doctor)."""
    smt = config.get("speculators_model_type")
    if smt in SPECULATORS_TYPES:
        return SPECULATORS_TYPES[smt], "speculators"
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch == DEEPSPEC_ARCH:
        rank = config.get("markov_rank")
        return ("dspark" if isinstance(rank, int) and rank > 0 else "dflash"), "deepspec"
    if arch in HF_ARCHS or (arch is None and isinstance(config.get("dflash_config"), dict)):
        family = HF_ARCHS.get(arch or "", "dflash")
        dflash = config.get("dflash_config")
        if config.get("eagle_aux_hidden_state_layer_ids") is not None:
            return family, "vllm-edited"
        if isinstance(dflash, dict) and "block_size" in dflash:
            return family, "sglang"
        return family, "zlab"
    return None


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


@dataclass
class BlockInspection:
    directory: Path
    config: dict[str, Any]
    family: str
    layout: str
    engine: str
    version: str
    rule: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    contract: WiringContract | None
    target_layers: int | None  # L of the target (the --target, else the contract's)
    target_vocab: int | None
    target_arch: str | None
    drafts: int | None = None  # tokens the engine's knobs draft per round (vLLM k; SGLang num_draft_tokens - 1)
    notes: list[str] = field(default_factory=list)
    small: dict[str, torch.Tensor] = field(default_factory=dict)  # d2t, t2d (read fully)

    @property
    def record(self) -> ReadFamily:
        return READ_FAMILIES[self.family]

    @property
    def layer(self) -> dict[str, Any]:
        """The draft's own decoder-layer config (speculators nest it)."""
        inner = self.config.get("transformer_layer_config")
        return inner if self.layout == "speculators" and isinstance(inner, dict) else self.config

    def ids(self, dotted: str) -> list[int] | None:
        return _ints(get(self.config, dotted))

    @property
    def num_draft_layers(self) -> int | None:
        n = self.layer.get("num_hidden_layers")
        return n if isinstance(n, int) else None

    @property
    def num_taps(self) -> int | None:
        """Taps the weights read: fc's input width / the target's hidden size."""
        fc = self.shapes.get("fc.weight")
        width = self.config.get("target_hidden_size") or self.layer.get("hidden_size")
        if fc is None or len(fc) != 2 or not isinstance(width, int) or width <= 0 or fc[1] % width:
            return None
        return fc[1] // width

    def trained(self) -> tuple[tuple[int, ...] | None, str]:
        """The boundaries the draft was trained on, and where that is known from: the contract side file, else the
        layout's own field in its writer's convention (unmeasured: doctor measures it)."""
        if self.contract is not None:
            return self.contract.taps, "the wiring contract (eaglewire_contract.json)"
        at, conv = layout_ids(self.layout)
        ids, L = self.ids(at), self.target_layers
        if ids is None or L is None:
            return None, "unknown"
        try:
            if self.layout == "deepspec":  # DeepSpec writes -1 for the embedding output (boundary 0)
                return from_engine(sorted(ids), conv, L), f"{at} as DeepSpec numbers it (-1 = embedding)"
            return from_engine(ids, conv, L), f"{at} as {self.layout} numbers it ({conv}), unmeasured"
        except TranslationError:
            return None, f"{at} {ids} is outside a {L}-layer target"


def read_block(
    directory: Path,
    config: dict[str, Any],
    engine: str,
    version: str | None,
    target: TargetInfo | None,
    drafts: int | None = None,
) -> BlockInspection:
    family, layout = block_layout(config) or ("dflash", "zlab")
    version, row = engine_rule(engine, version)
    shapes: dict[str, tuple[int, ...]] = {}
    small: dict[str, torch.Tensor] = {}
    weights = directory / "model.safetensors"
    if weights.is_file():
        with open_safetensors(weights, what="draft weights") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            small = {k: f.get_tensor(k) for k in ("d2t", "t2d") if k in shapes}
    contract = read_contract(directory) if (directory / CONTRACT_FILE).is_file() else None
    ident = getattr(target, "identity", None) if target is not None else None
    ct = contract.target if contract is not None else None
    L = getattr(target, "num_layers", None) if target is not None else None
    return BlockInspection(
        directory,
        config,
        family,
        layout,
        engine,
        version,
        row,
        shapes,
        contract,
        L if isinstance(L, int) else (ct.num_layers if ct else None),
        getattr(target, "vocab_size", None) or (ct.vocab_size if ct else None),
        getattr(ident, "architecture", None) or (ct.architecture if ct else None),
        drafts,
        small=small,
    )


def is_block_dir(directory: Path) -> dict[str, Any] | None:
    """The config of a block drafter's directory, None for any other directory."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    config = read_json_object(path, what="a draft config")
    if config.get("format") == "eaglewire.draft/1":  # a native checkpoint: its contract names the family
        contract = config.get("contract")
        return config if isinstance(contract, dict) and contract.get("family") not in (None, "eagle3") else None
    return config if block_layout(config) is not None else None
