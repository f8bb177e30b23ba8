"""Block-drafter checks (DFlash, DFlash2, DSpark): each takes a BlockInspection and returns findings, level ·
what · why (the engine's behaviour, with the PR or issue it comes from) · fix. Listed as checks.py lists the
EAGLE-3 ones, in a list of their own (BLOCK_CHECKS): an EAGLE-3 draft never reaches these, a block drafter never
those. The tap checks are block_tap_checks.py's, the checks of how the engine runs the block block_slot_checks.py's;
this module holds the vocabulary and engine-path checks, and the report.

What the draft was trained on comes from its wiring contract where it has one, else from the layout's own field
read in its writer's convention (then the taps are unmeasured, and said so). What the engine delivers comes
from the engine rule of block_rules.json for the engine and version asked for (and, for SGLang's layer ids,
the target's model file: export/sglang_rules.json).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from eaglewire.doctor.block_inspect import BlockInspection
from eaglewire.doctor.block_slot_checks import (
    block_anchor,
    block_attention,
    block_knobs,
    block_mask_token,
    block_rope,
    block_size,
)
from eaglewire.doctor.block_tap_checks import block_eagle_aux, block_read, block_taps
from eaglewire.doctor.vocab_checks import vocab_map_findings
from eaglewire.doctor.findings import Finding, Report, by_level
from eaglewire.export.checkpoint import FORMAT as NATIVE_FORMAT
from eaglewire.target.protocol import TargetInfo

BlockCheck = Callable[[BlockInspection], list[Finding]]


def _f(level: str, name: str, what: str, why: str, fix: str) -> Finding:
    return Finding(level, name, what, why, fix)


# ---- the checks ----------------------------------------------------------------------------------------------


def block_vocab(ins: BlockInspection) -> list[Finding]:
    vd, V = ins.config.get("draft_vocab_size"), ins.target_vocab or ins.layer.get("vocab_size")
    reduced = "d2t" in ins.shapes or "lm_head.weight" in ins.shapes or vd not in (None, V, ins.layer.get("vocab_size"))
    if ins.record.full_vocab_selector and reduced:
        return [
            _f(
                "error",
                "block_vocab",
                "a DFlash2 draft with a reduced vocabulary (d2t / draft_vocab_size)",
                "DFlash2's candidate selector scores the full vocabulary: speculators' DFlash2 config refuses a "
                "d2t map, and an engine reading one drafts other tokens",
                "export with the full vocabulary",
            )
        ]
    if not reduced:
        return []
    out = []
    if ins.engine == "sglang":
        out.append(
            _f(
                "error",
                "block_vocab",
                "a block drafter with its own head (lm_head / d2t) on SGLang",
                "SGLang's DFlash model has no head of its own: its load_weights skips lm_head and d2t and it "
                "drafts through the target's head, not the one the draft trained",
                "serve it on vLLM (eaglewire export --format vllm), or train over the full vocabulary",
            )
        )
    return out + vocab_map_findings(V, vd, ins.shapes.get("lm_head.weight"), ins.small.get("d2t"), ins.small.get("t2d"))


def block_engine_path(ins: BlockInspection) -> list[Finding]:
    out = []
    if isinstance(ins.config.get("quantization_config"), dict):
        out.append(
            _f(
                "warn",
                "block_engine_path",
                "the draft config carries a quantization_config",
                "a draft config copied from its target inherits the target's quantization: the engine then "
                "quantizes (or fails to load) the bf16 draft layers (sglang #28196)",
                "delete quantization_config unless the draft itself was quantized",
            )
        )
    if ins.record.full_vocab_selector and ins.engine == "vllm":
        out.append(
            _f(
                "warn",
                "block_engine_path",
                "a DFlash2 draft on vLLM",
                "its candidate selector runs only on vLLM's V2 model runner; on V1 it silently runs as plain "
                "DFlash, at lower acceptance (club-3090 #1064)",
                "serve with VLLM_USE_V2_MODEL_RUNNER=1",
            )
        )
    if ins.layout == "deepspec":
        ids, L = ins.ids("target_layer_ids") or [], ins.target_layers
        if -1 in ids and ins.engine == "sglang":
            out.append(
                _f(
                    "error",
                    "block_engine_path",
                    "target_layer_ids holds -1 (DeepSpec's name for the embedding output)",
                    "SGLang requires 0 <= id < L and refuses the draft",
                    "serve it on vLLM, or retrain without the embedding tap",
                )
            )
        if L is not None and L - 1 in ids:
            out.append(
                _f(
                    "error",
                    "block_engine_path",
                    f"target_layer_ids holds {L - 1}, the target's last layer",
                    "DeepSpec forbids it: its stored final state is post-norm, the engines capture it pre-norm",
                    "retrain on another layer",
                )
            )
    return out


# every block check, in the order it reports: by_level sorts the findings by level only, so within a level this
# order is the report's
BLOCK_CHECKS: list[BlockCheck] = [
    block_read,
    block_taps,
    block_eagle_aux,
    block_rope,
    block_size,
    block_knobs,
    block_mask_token,
    block_attention,
    block_anchor,
    block_vocab,
    block_engine_path,
]


# ---- the report ----------------------------------------------------------------------------------------------


@dataclass
class BlockReport(Report):
    """The doctor's verdict on a block drafter: the EAGLE-3 report's fields, plus the family and layout found and
    the engine version whose rule was applied (in --json too)."""

    engine_version: str = ""
    family: str = ""
    layout: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "directory": self.directory,
                "engine": self.engine,
                "engine_version": self.engine_version,
                "family": self.family,
                "layout": self.layout,
                "errors": self.errors,
                "findings": [asdict(f) for f in self.findings],
                "measurement": self.measurement,
            },
            indent=2,
        )


def run_block_checks(ins: BlockInspection) -> BlockReport:
    found = by_level([f for c in BLOCK_CHECKS for f in c(ins)])
    return BlockReport(
        str(ins.directory), ins.engine, found, engine_version=ins.version, family=ins.family, layout=ins.layout
    )


def check_block(
    directory: Path,
    config: dict[str, Any],
    engine: str | None,
    engine_version: str | None,
    target: TargetInfo | None,
    shape: Any = None,
) -> BlockReport:
    """The doctor on a block drafter's directory for `engine` (None: SGLang for a config laid out for SGLang,
    else vLLM) at `engine_version` (None: the newest row of block_rules.json); `shape`: the engine's knobs."""
    from eaglewire.doctor.block_inspect import block_layout, read_block

    if config.get("format") == NATIVE_FORMAT:  # our own checkpoint: checked as its export for `engine` reads it
        if engine is None:
            from eaglewire.export.convert import detect_engine

            detect_engine(config)  # refuses a native checkpoint without --engine, as for EAGLE-3 drafts
        return _check_native(Path(directory), engine or "vllm", engine_version, target, shape)
    if engine is None:
        engine = "sglang" if (block_layout(config) or ("", ""))[1] == "sglang" else "vllm"
    drafts = shape.num_draft_tokens - 1 if shape is not None else None  # a decoding.tree.TreeShape (knobs)
    return run_block_checks(read_block(Path(directory), config, engine, engine_version, target, drafts))


def _check_native(
    directory: Path, engine: str, engine_version: str | None, target: TargetInfo | None, shape: Any
) -> BlockReport:
    """A native block-drafter checkpoint, checked through the export `eaglewire export --format ENGINE` writes
    (in a temporary directory): what that engine would be handed."""
    import tempfile

    from eaglewire.export.block import export_block_draft
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.safeio import read_json_object

    draft = load_checkpoint(directory, dtype=None)
    with tempfile.TemporaryDirectory() as tmp:
        out = export_block_draft(draft, draft.contract, Path(tmp) / engine, engine)
        report = check_block(
            out, read_json_object(out / "config.json", what="a draft config"), engine, engine_version, target, shape
        )
    report.directory, report.layout = str(directory), f"native (as exported for {engine})"
    return report
