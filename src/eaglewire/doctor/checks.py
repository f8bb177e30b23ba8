"""Doctor checks. Each takes the inspection and the target and returns findings:
level (error / warn / info) · what · why it matters · how to fix. Errors are things that make an engine
run the draft at acceptance ~1 (or not at all); a healthy export of any format yields no error (tested).

This module holds the checks of names, heads and the contract, and CHECKS, every check in the order it reports;
the others live by group: weights.py, geometry.py, vocab_checks.py, tap_checks.py, norm_checks.py,
target_checks.py, peagle_checks.py.
"""

from __future__ import annotations

from typing import Any, Callable

from eaglewire.capture.boundary_file import DumpTarget, loaded
from eaglewire.doctor.findings import Finding, Report, by_level
from eaglewire.doctor.geometry import geometry_findings
from eaglewire.doctor.inspect import Inspection
from eaglewire.doctor.norm_checks import norm_flags
from eaglewire.doctor.peagle_checks import peagle
from eaglewire.doctor.tap_checks import fc_width, layer_ids
from eaglewire.doctor.target_checks import target_match
from eaglewire.doctor.vocab_checks import vocab_map
from eaglewire.doctor.weights import weight_findings
from eaglewire.target.protocol import TargetInfo


Check = Callable[[Inspection, Any], list[Finding]]


def _f(level: str, name: str, what: str, why: str, fix: str) -> Finding:
    return Finding(level, name, what, why, fix)


def key_naming(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    layer_keys = [k for k in ins.shapes if k.startswith(("midlayer.", "layers."))]
    wrong = [
        k
        for k in layer_keys
        if not k.startswith(ins.engine.layer0_prefixes) and not (ins.engine.multi_layer and k.startswith("layers."))
    ]
    if not wrong:
        return []
    return [
        _f(
            "error",
            "key_naming",
            f"{len(wrong)} decoder-layer weights are named for another engine "
            f"(e.g. {wrong[0]!r}); {ins.engine.name} expects {list(ins.engine.layer0_prefixes)}",
            "this engine "
            + (
                "drops unknown names silently: the layer stays randomly initialised"
                if ins.engine.skips_unknown_keys
                else "refuses to load them"
            ),
            f"eaglewire import DIR --format <source> then eaglewire export --format {ins.engine.name}",
        )
    ]


def heads_and_embeddings(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    out = []
    if "lm_head.weight" not in ins.shapes:
        out.append(
            _f(
                "error",
                "lm_head",
                "lm_head.weight is missing",
                "the engine keeps a random head, or (SGLang with draft_vocab_size null) the target's "
                "full-vocab head, which the draft was not trained with",
                "re-export from the trained draft",
            )
        )
    if ins.config.get("tie_word_embeddings") and ins.engine.tied_head_from_embedding:
        out.append(
            _f(
                "error",
                "tie_word_embeddings",
                "config has tie_word_embeddings: true",
                "SGLang then uses the embedding as the draft head and ignores the trained reduced-vocab lm_head",
                "set tie_word_embeddings: false (eaglewire export does)",
            )
        )
    has_embed = "embed_tokens.weight" in ins.shapes
    ths = ins.layer_config.get("target_hidden_size") or ins.config.get("target_hidden_size")
    if ins.engine.embedding_needed_if_resized and ths is not None and not has_embed:
        out.append(
            _f(
                "error",
                "embed_tokens",
                "target_hidden_size is set but embed_tokens.weight is missing",
                "SafeAILab EAGLE then does not take the target's embedding and loads non-strictly: the "
                "embedding stays randomly initialised",
                "remove target_hidden_size or export --with-embedding",
            )
        )
    if has_embed and loaded(target) and ins.shapes["embed_tokens.weight"] != tuple(target.embed_tokens.weight.shape):
        out.append(
            _f(
                "error",
                "embed_tokens",
                f"embed_tokens has shape {ins.shapes['embed_tokens.weight']}, the "
                f"target's is {tuple(target.embed_tokens.weight.shape)}",
                "the draft embeds tokens with another vocabulary",
                "drop embed_tokens from the export (engines share the target's)",
            )
        )
    return out


def dump_scope(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if not isinstance(target, DumpTarget):
        return []
    return [
        _f(
            "info",
            "target",
            f"checked against {target.name}, not the loaded target",
            "the checks that read the target's weights or config were skipped: its rope_theta and "
            "max_position_embeddings against the draft's, embed_tokens' shape, an lm_head copied from the "
            "target's",
            "run eaglewire doctor DIR --target T where the target loads for those",
        )
    ]


NO_CONTRACT = "no eaglewire_contract.json: the training-side truth is unknown"


def after_measurement(findings: list[Finding]) -> list[Finding]:
    """The findings once the boundaries were measured on the target: the no-contract INFO says what was done and
    what to do with it, instead of asking for the --target that was given."""
    return [
        _f(
            "info",
            "contract",
            NO_CONTRACT,
            "so the trained boundaries were measured on the target (measured_wiring)",
            "record what was measured: eaglewire import DIR --format ENGINE --target T "
            "--out DIR2 (every export from it writes the measured ids)",
        )
        if f.check == "contract" and f.what == NO_CONTRACT
        else f
        for f in findings
    ]


def dtype_and_contract(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    out = []
    floats = {d for k, d in ins.dtypes.items() if k not in ("d2t", "t2d")}
    if len(floats) > 1:
        out.append(
            _f(
                "warn",
                "dtype",
                f"mixed weight dtypes {sorted(floats)}",
                "engines cast on load; precision may differ from training",
                "export with one --dtype",
            )
        )
    if ins.dtypes.get("d2t") not in (None, "I64"):
        out.append(
            _f("error", "d2t", f"d2t is {ins.dtypes['d2t']}, not int64", "engines add it to int64 ids", "re-export")
        )
    if ins.contract is None:
        out.append(
            _f(
                "info",
                "contract",
                NO_CONTRACT,
                "layer ids, taps and norms can only be checked for internal consistency, or measured",
                "give --target to measure the trained boundaries (eaglewire doctor DIR --target T), "
                "or import with --target to record them",
            )
        )
    elif ins.contract.inferred is not None:
        ev = ins.contract.inferred
        how = (
            f"measured on the target ({ev.get('tokens')} tokens, weak evidence: {ev.get('weak_evidence')})"
            if ev["source"] == "measured"
            else f"read from the {ev.get('engine')} config's layer ids, unmeasured"
        )
        out.append(
            _f(
                "info",
                "contract",
                f"the contract's taps {list(ins.contract.taps)} were inferred, not known from training: {how}",
                "the draft came from another tool (eaglewire import)",
                "nothing to fix; eaglewire doctor DIR --target T --measure measures again",
            )
        )
    return out


def run_checks(ins: Inspection, target: TargetInfo | None) -> Report:
    return Report(str(ins.directory), ins.engine.name, by_level([f for c in CHECKS for f in c(ins, target)]))


# every check, in the order it reports: by_level sorts the findings by level only, so within a level this order
# is the report's
CHECKS: list[Check] = [
    weight_findings,
    geometry_findings,
    key_naming,
    heads_and_embeddings,
    vocab_map,
    layer_ids,
    fc_width,
    norm_flags,
    target_match,
    dump_scope,
    dtype_and_contract,
    peagle,  # P-EAGLE only: appended to the EAGLE-3 checks
]
