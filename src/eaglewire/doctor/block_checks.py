"""Block-drafter checks (DFlash, DFlash2, DSpark): each takes a BlockInspection and returns findings, level ·
what · why (the engine's behaviour, with the PR or issue it comes from) · fix. Registered as checks.py registers
the EAGLE-3 ones, in a list of their own: an EAGLE-3 draft never reaches these, a block drafter never those.

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

from eaglewire.contract import renumber
from eaglewire.doctor.block_delivery import Delivery, delivery
from eaglewire.doctor.block_inspect import BlockInspection, field_convention
from eaglewire.doctor.vocab_checks import vocab_map_findings
from eaglewire.doctor.findings import Finding, Report, by_level
from eaglewire.export.checkpoint import FORMAT as NATIVE_FORMAT
from eaglewire.target.protocol import TargetInfo

_IDS, _AUX = "dflash_config.target_layer_ids", "eagle_aux_hidden_state_layer_ids"
BlockCheck = Callable[[BlockInspection], list[Finding]]
BLOCK_CHECKS: list[BlockCheck] = []


def block_check(fn: BlockCheck) -> BlockCheck:
    BLOCK_CHECKS.append(fn)
    return fn


def _f(level: str, name: str, what: str, why: str, fix: str) -> Finding:
    return Finding(level, name, what, why, fix)


# ---- the checks ----------------------------------------------------------------------------------------------


@block_check
def block_read(ins: BlockInspection) -> list[Finding]:
    trained, source = ins.trained()
    d = delivery(ins)
    return [
        _f(
            "info",
            "block_read",
            f"a {ins.family} draft in {ins.layout} layout, checked for {ins.engine} "
            f"{ins.version}: trained taps {list(trained) if trained else 'unknown'} (from {source}); the engine "
            f"reads {d.field}: {d.how}",
            f"engine rule: {ins.rule['source']}",
            "nothing to fix; --engine-version names another engine version",
        )
    ]


def _shift(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    diffs = {x - y for x, y in zip(a, b)}
    return diffs.pop() if len(a) == len(b) and len(diffs) == 1 else None


@block_check
def block_taps(ins: BlockInspection) -> list[Finding]:
    trained, source = ins.trained()
    d = delivery(ins)
    n = ins.num_taps
    if d.guessed:
        return _missing_ids(ins, d, trained)
    if d.boundaries is None:
        if "KeyError" in d.how:
            return [
                _f(
                    "error",
                    "block_ids_missing",
                    f"{d.field} is missing",
                    d.how + ": the draft does not load",
                    "re-export the draft (eaglewire import DIR --target T, then eaglewire export --format vllm)",
                )
            ]
        return [
            _f(
                "warn",
                "block_taps",
                "the boundaries the engine captures could not be worked out",
                d.how,
                "pass --target (or --engine-version) so the doctor knows the target's model file",
            )
        ]
    out = []
    if n is not None and n != len(d.boundaries):
        out.append(
            _f(
                "error",
                "block_taps",
                f"{d.field} names {len(d.boundaries)} layers but fc.weight reads {n} taps",
                "vLLM raises at the first request (DFlash drafter expects ... concatenated aux "
                "features); speculators' z-lab converter drops an id whose +1 is the verifier's last layer",
                "write one id per tap the draft was trained on (eaglewire export does)",
            )
        )
    L = ins.target_layers
    if L is not None and any(not 0 <= b <= L for b in d.boundaries):
        out.append(
            _f(
                "error",
                "block_taps",
                f"{ins.engine} would capture boundaries {list(d.boundaries)} of a {L}-layer target",
                "an id outside the target: the engine refuses the draft or indexes another layer",
                "write the ids in the engine's numbering (eaglewire wiring translate)",
            )
        )
    if trained is None or out or tuple(d.boundaries) == tuple(trained):
        return out
    k = _shift(tuple(d.boundaries), tuple(trained))
    what = (
        f"{ins.engine} {ins.version} captures boundaries {list(d.boundaries)} from {d.field}, "
        f"but the draft was trained on {list(trained)} (from {source})" + (f": every tap off by {k:+d}" if k else "")
    )
    return [
        _f(
            "error",
            "block_taps",
            what,
            f"{d.how}; the draft then reads other layers than it was trained on: "
            "it loads, serves correct text, and accepts almost nothing",
            f"re-export for this engine and version (eaglewire export --format {ins.engine}), or write "
            f"{d.field} in {ins.engine}'s numbering (eaglewire wiring translate --family {ins.family})",
        )
    ]


def _missing_ids(ins: BlockInspection, d: Delivery, trained: tuple[int, ...] | None) -> list[Finding]:
    n = ins.num_taps
    if ins.layout == "speculators" and ins.engine == "sglang":
        aux, L = ins.ids("aux_hidden_state_layer_ids") or [], ins.target_layers
        speculators, sglang = field_convention("vllm", "aux_hidden_state_layer_ids"), field_convention("sglang", _IDS)
        return [
            _f(
                "error",
                "block_ids_missing",
                "a speculators config on SGLang: SGLang reads no "
                "aux_hidden_state_layer_ids, so it finds no target layer ids",
                d.how,
                f"write dflash_config.target_layer_ids {list(renumber(aux, speculators, sglang, L))} "
                "(speculators' HF indices - 1: "
                "SGLang adds 1, speculators #753), or eaglewire import DIR --format vllm --target T, then "
                "eaglewire export --format sglang",
            )
        ]
    if d.boundaries is None:
        return [
            _f(
                "error",
                "block_ids_missing",
                "the config names no target layer ids",
                d.how,
                "write the ids the draft was trained on (eaglewire export writes them)",
            )
        ]
    loud = n is not None and n != len(d.boundaries)
    if not loud and trained is not None and tuple(d.boundaries) == tuple(trained):
        return [
            _f(
                "warn",
                "block_ids_missing",
                f"the config names no target layer ids; {ins.engine}'s guess "
                f"{list(d.boundaries)} happens to be the trained taps",
                d.how,
                "write the ids explicitly: the guess changes with the target's depth and the draft's layers",
            )
        ]
    return [
        _f(
            "error",
            "block_ids_missing",
            f"the config names no target layer ids: {ins.engine} captures "
            f"boundaries {list(d.boundaries)}"
            + (f", {n} taps wide in fc.weight" if loud else f", the draft was trained on {list(trained or ())}"),
            d.how
            + (
                "; the fc width then mismatches and the engine fails at the first request"
                if loud
                else ": the count is right and the layers are wrong, so acceptance collapses with no error"
            ),
            "write the ids the draft was trained on (eaglewire export writes them)",
        )
    ]


@block_check
def block_eagle_aux(ins: BlockInspection) -> list[Finding]:
    aux, ids = ins.ids(_AUX), ins.ids(_IDS)
    same = (
        aux is not None
        and ids is not None
        and tuple(aux)
        == renumber(ids, field_convention("vllm", _IDS), field_convention("vllm", _AUX), ins.target_layers)
    )
    if aux is None or ids is None or same or ins.layout == "speculators":
        return []
    return [
        _f(
            "error" if ins.engine == "vllm" else "warn",
            "block_eagle_aux",
            f"eagle_aux_hidden_state_layer_ids {aux} is left beside "
            f"dflash_config.target_layer_ids {ids}, and they name different layers (vLLM reads the first as is, "
            "the second + 1)",
            "vLLM's runner takes eagle_aux_hidden_state_layer_ids first and silently ignores "
            "dflash_config.target_layer_ids (_get_eagle3_aux_layers_from_config); SGLang reads only the DFlash ids",
            "delete eagle_aux_hidden_state_layer_ids, or set it to target_layer_ids + 1",
        )
    ]


@block_check
def block_rope(ins: BlockInspection) -> list[Finding]:
    layer = ins.layer
    neox = [layer.get(k, ins.config.get(k)) for k in ("is_neox_style", "rope_is_neox_style")]
    off = any(v is False for v in neox)
    src = ins.rule["rope_from"]
    if off and src == "draft":
        return [
            _f(
                "error",
                "block_rope",
                "the draft config says is_neox_style: false, and DFlash drafts are "
                "trained with neox (rotate-half) RoPE",
                f"{ins.engine} {ins.version} takes the draft's RoPE "
                "layout from its config (vLLM PR #54373; SGLang rope_is_neox_style): every drafted attention "
                "score is rotated the other way, acceptance ~1 with no error (vLLM #53063)",
                "delete is_neox_style from the config, or set it to true",
            )
        ]
    if src == "target":
        return [
            _f(
                "warn",
                "block_rope",
                f"vLLM {ins.version} gives the draft the TARGET's RoPE layout and ignores "
                "the draft config's is_neox_style",
                "vLLM 0.28 (PR #51655, before PR #54373): a neox-trained "
                "draft on an interleaved-RoPE target (GLM) ran at acceptance ~1.0 with no error (vLLM #53063)",
                "serve on vLLM 0.29 or later (PR #54373) when the target's RoPE is not neox",
            )
        ]
    if off and src == "neox":
        return [
            _f(
                "warn",
                "block_rope",
                "the draft config says is_neox_style: false, and "
                f"vLLM {ins.version} ignores it: its DFlash attention always rotates neox (get_rope's default)",
                "a draft really trained with interleaved RoPE would accept ~1 with no error; vLLM reads the "
                "flag from 0.29 (PR #54373)",
                "if the draft was trained with neox RoPE (DFlash's default), delete "
                "the flag; if not, serve on vLLM 0.29 or later",
            )
        ]
    return []


def _config_block(ins: BlockInspection) -> tuple[int | None, str]:
    dflash = ins.config.get("dflash_config")
    if ins.engine == "sglang" and isinstance(dflash, dict) and isinstance(dflash.get("block_size"), int):
        return dflash["block_size"], "dflash_config.block_size"
    b = ins.config.get("block_size")
    return (b, "block_size") if isinstance(b, int) and not isinstance(b, bool) else (None, "block_size")


@block_check
def block_size(ins: BlockInspection) -> list[Finding]:
    b, at = _config_block(ins)
    trained = ins.contract.block.block_size if ins.contract is not None and ins.contract.block else None
    out = []
    if b is None:
        out.append(
            _f(
                "warn",
                "block_size",
                "the config names no block size",
                "SGLang then runs its default "
                "block; vLLM's DFlash runs 1 + num_speculative_tokens slots, and users size that knob from "
                "block_size (DFlash: B-1, DSpark: B)",
                "write block_size (eaglewire export does)",
            )
        )
    elif trained is not None and b != trained:
        why = (
            "SGLang runs the block the config names (parse_dflash_draft_config): the masks sit at other positions "
            "than in training"
            if ins.engine == "sglang"
            else "vLLM sizes the block from "
            "--num-speculative-tokens, which users set from block_size (DFlash: B-1): a block of another size "
            "puts masks at positions the draft never learned"
        )
        out.append(
            _f(
                "error",
                "block_size",
                f"{at} is {b}, but the draft was trained with blocks of {trained}",
                why,
                f"set {at} to {trained}; launch vLLM with num_speculative_tokens "
                f"{trained if ins.record.anchor_first else trained - 1}",
            )
        )
    top, inner = (
        ins.config.get("block_size"),
        (ins.config.get("dflash_config") or {}).get("block_size")
        if isinstance(ins.config.get("dflash_config"), dict)
        else None,
    )
    if isinstance(top, int) and isinstance(inner, int) and top != inner:
        out.append(
            _f(
                "error",
                "block_size",
                f"block_size {top} (top level) and dflash_config.block_size {inner} disagree",
                "SGLang reads dflash_config first, other readers the top level: the two engines run different blocks",
                "keep one value, in both places",
            )
        )
    return out


@block_check
def block_knobs(ins: BlockInspection) -> list[Finding]:
    """The engine's draft count against the block the draft was trained with (DFlash: B - 1, DSpark: B)."""
    b = ins.contract.block if ins.contract is not None else None
    size = b.block_size if b else _config_block(ins)[0]
    if ins.drafts is None or size is None:
        return []
    first = (b.anchor_layout == "anchor_first") if b else ins.record.anchor_first
    want = size if first else size - 1
    knob = f"--num-speculative-tokens {want}" if ins.engine == "vllm" else f"--speculative-num-draft-tokens {want + 1}"
    if ins.drafts > want:
        return [
            _f(
                "error",
                "block_knobs",
                f"the engine's knobs draft {ins.drafts} tokens per round, the draft was "
                f"trained on blocks of {size} ({want} drafts)",
                "vLLM runs one bonus query and k mask queries "
                "(config/speculative.py), SGLang a block of its num_draft_tokens: slots past the trained block "
                "sit at positions the draft never learned and are rejected",
                f"launch with {knob}",
            )
        ]
    if ins.drafts < want:
        return [
            _f(
                "info",
                "block_knobs",
                f"the engine's knobs draft {ins.drafts} of the {want} tokens a block of {size} can draft",
                "a shorter block is served correctly; the later positions are left unused",
                f"{knob} drafts the whole block (worth it where acceptance at those positions pays)",
            )
        ]
    return []


@block_check
def block_mask_token(ins: BlockInspection) -> list[Finding]:
    dflash = ins.config.get("dflash_config") if isinstance(ins.config.get("dflash_config"), dict) else {}
    m = dflash.get("mask_token_id", ins.config.get("mask_token_id"))
    trained = ins.contract.block.mask_token_id if ins.contract is not None and ins.contract.block else None
    V = ins.target_vocab
    if m is None:
        return [
            _f(
                "error",
                "block_mask_token",
                "the config names no mask_token_id",
                "vLLM refuses the draft "
                "(mask_token_id is required); SGLang looks the string <|MASK|> up in the target's tokenizer, "
                "which most targets do not have",
                f"write mask_token_id{f' {trained}' if trained else ''} (eaglewire export does)",
            )
        ]
    if not isinstance(m, int) or isinstance(m, bool) or m < 0 or (V is not None and m >= V):
        return [
            _f(
                "error",
                "block_mask_token",
                f"mask_token_id {m!r} is not a row of the target's embedding (vocab {V})",
                "the mask slots are embedded with the target's embedding: an id outside it "
                "fails to load or reads another table",
                "write the id the draft was trained with",
            )
        ]
    if trained is not None and m != trained:
        return [
            _f(
                "error",
                "block_mask_token",
                f"mask_token_id is {m}, but the draft was trained with {trained}",
                "every mask slot is embedded as another token: the draft drafts from the wrong input and "
                "accepts almost nothing, with no error",
                f"set mask_token_id to {trained}",
            )
        ]
    return []


@block_check
def block_attention(ins: BlockInspection) -> list[Finding]:
    out = []
    types = ins.layer.get("layer_types")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"] if isinstance(types, list) else []
    if sliding and ins.rule.get("layer_types_read") is False:
        out.append(
            _f(
                "error",
                "block_attention",
                f"draft layers {sliding} are sliding-window layers, and "
                f"{ins.engine} {ins.version} has no layer_types reader for DFlash drafts",
                "they run as full attention: acceptance falls off after the window's length (vLLM #40898)",
                "serve on SGLang 0.5.23 or vLLM 0.25 or later, which read layer_types",
            )
        )
    snc = ins.config.get("sliding_window_non_causal")
    full = not isinstance(types, list) or len(sliding) < len(types)
    if (
        ins.layout == "speculators"
        and ins.record.vllm_causal_override
        and ins.engine == "vllm"
        and snc is False
        and full
    ):
        out.append(
            _f(
                "error",
                "block_attention",
                "sliding_window_non_causal is false (speculators' default)",
                "vLLM's update_dflash sets dflash_config.causal = not sliding_window_non_causal, and that "
                "overrides EVERY draft layer (qwen3_dflash.py _dflash_layer_causal): the full-attention "
                "layers, trained bidirectional, run causal",
                "set sliding_window_non_causal: true in config.json (eaglewire export writes it)",
            )
        )
    return out


@block_check
def block_anchor(ins: BlockInspection) -> list[Finding]:
    sfa = ins.config.get("sample_from_anchor")
    trained = ins.contract.block.anchor_layout if ins.contract is not None and ins.contract.block else None
    out = []
    if ins.record.vllm_anchor_default_differs and ins.layout == "speculators" and ins.engine == "vllm" and sfa is None:
        out.append(
            _f(
                "error",
                "block_anchor",
                "a speculators DSpark config without sample_from_anchor",
                "speculators' DSpark defaults to sample_from_anchor true (anchor-first), vLLM's update_dspark "
                "to false: vLLM runs it in the DFlash layout (dspark_bonus_anchor true), one slot off",
                "write sample_from_anchor: true",
            )
        )
    if trained is not None and sfa is not None and bool(sfa) != (trained == "anchor_first"):
        out.append(
            _f(
                "error",
                "block_anchor",
                f"sample_from_anchor is {sfa}, the draft was trained with the {trained} layout",
                "slot k then predicts another position than in training (p+k vs p+k+1)",
                f"set sample_from_anchor to {str(trained == 'anchor_first').lower()}",
            )
        )
    return out


@block_check
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


@block_check
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
