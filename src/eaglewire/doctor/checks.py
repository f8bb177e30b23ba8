"""Doctor checks. Each takes the inspection and the target and returns findings:
level (error / warn / info) · what · why it matters · how to fix. Errors are things that make an engine
run the draft at acceptance ~1 (or not at all); a healthy export of any format yields no error (tested).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from eaglewire.contract import CONVENTIONS, default_taps, from_engine
from eaglewire.capture.boundary_file import DumpTarget, loaded
from eaglewire.doctor.findings import Finding, Report, by_level
from eaglewire.doctor.geometry import geometry_findings
from eaglewire.doctor.inspect import Inspection
from eaglewire.doctor.weights import weight_findings
from eaglewire.export.engines import IDS_KEY, NESTED_IDS_KEY, Engine, engine_for
from eaglewire.export.sglang_rules import RELEASES as SGLANG_RELEASES
from eaglewire.errors import EaglewireError


Check = Callable[[Inspection, Any], list[Finding]]
CHECKS: list[Check] = [weight_findings, geometry_findings]


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def _f(level: str, name: str, what: str, why: str, fix: str) -> Finding:
    return Finding(level, name, what, why, fix)


@check
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


@check
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


@check
def vocab_map(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    V = target.vocab_size if target is not None else ins.layer_config.get("vocab_size")
    return vocab_map_findings(
        V,
        ins.config.get("draft_vocab_size"),
        ins.shapes.get("lm_head.weight"),
        ins.small.get("d2t"),
        ins.small.get("t2d"),
    )


def vocab_map_findings(
    V: int | None, vd: Any, head: tuple[int, ...] | None, d2t: torch.Tensor | None, t2d: torch.Tensor | None
) -> list[Finding]:
    """A draft's vocabulary as an engine reads it, for any family with a head of its own: the target's vocab
    size V, the config's draft_vocab_size vd, the lm_head's shape, the d2t offsets and the t2d mask."""
    out = []
    if vd is not None and V is not None and vd > V:
        out.append(
            _f(
                "error",
                "draft_vocab_size",
                f"draft_vocab_size {vd} > target vocab {V}",
                "the draft can name tokens the target does not have",
                "rebuild the vocab map",
            )
        )
    if vd is None and head is not None and V is not None and head[0] != V:
        out.append(
            _f(
                "error",
                "draft_vocab_size",
                f"draft_vocab_size is missing but lm_head has {head[0]} of the target's {V} rows",
                "the engine then sizes the draft's vocabulary as the target's: vLLM "
                "refuses the file (no draft_id_to_target_id parameter), others misread the head",
                f"write draft_vocab_size: {head[0]} (eaglewire export does)",
            )
        )
    if head is not None and vd is not None and head[0] != vd:
        out.append(
            _f(
                "error",
                "draft_vocab_size",
                f"lm_head has {head[0]} rows but draft_vocab_size is {vd}",
                "the engine sizes its head from the config: loading fails or rows are misread",
                "re-export",
            )
        )
    if d2t is None:
        if vd is not None and V is not None and vd < V:
            out.append(
                _f(
                    "error",
                    "d2t",
                    "d2t is missing for a reduced draft vocabulary",
                    "vLLM then maps draft id i to target id i (zeros), SGLang fails: every drafted token is wrong",
                    "export the vocab map (eaglewire export writes d2t and t2d)",
                )
            )
        return out
    if d2t.dtype not in (torch.int64, torch.int32) or d2t.dim() != 1 or not d2t.numel():
        return out  # not a map of offsets at all: dtype_and_contract names its dtype, key shapes its shape
    ids = torch.arange(d2t.numel()) + d2t
    if V is not None and (int(ids.max()) >= V or int(ids.min()) < 0):
        absolute = int(d2t.max()) < V and bool((d2t[1:] > d2t[:-1]).all())
        out.append(
            _f(
                "error",
                "d2t",
                "d2t maps draft ids outside the target vocabulary"
                + (" — it holds ABSOLUTE target ids, not offsets" if absolute else ""),
                "engines compute target = i + d2t[i]",
                "store offsets: d2t[i] = target_id[i] - i",
            )
        )
    elif not bool((ids[1:] > ids[:-1]).all()):
        out.append(
            _f(
                "warn",
                "d2t",
                "draft ids are not in ascending target-id order",
                "trainers that slice target logits with t2d assume ascending order; the rows would not align",
                "rebuild the vocab map sorted by target id",
            )
        )
    if t2d is not None and t2d.dim() == 1:
        if vd is not None and int(t2d.sum()) != vd:
            out.append(
                _f(
                    "error",
                    "t2d",
                    f"t2d.sum() = {int(t2d.sum())} but draft_vocab_size = {vd}",
                    "the map does not describe this draft's vocabulary",
                    "rebuild the vocab map",
                )
            )
        elif V is not None and t2d.numel() == V and int(ids.max()) < V and not bool(t2d[ids].all()):
            out.append(
                _f(
                    "error",
                    "t2d",
                    "d2t and t2d disagree on which target ids are in the draft vocab",
                    "one of them belongs to another vocab map",
                    "rebuild the vocab map",
                )
            )
    return out


def engine_ids(ins: Inspection) -> tuple[list[int] | None, str | None, list[str]]:
    """(ids the engine reads, the key it read them from, keys that hold ids it does NOT read)."""
    found = None
    for key in ins.engine.id_keys:
        v = ins.get(key)
        if v is not None:
            found = (list(v), key)
            break
    others = [k for k in (IDS_KEY, NESTED_IDS_KEY) if ins.get(k) is not None and k not in ins.engine.id_keys]
    return (found[0], found[1], others) if found else (None, None, others)


@check
def layer_ids(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if ins.engine.hard_coded_taps:
        return _eagle_taps(ins, target)
    L = target.num_layers if target is not None else None
    ids, key, ignored = engine_ids(ins)
    trained = ins.contract.taps if ins.contract else None
    if ids is None:
        default = default_taps(L) if L and L >= 8 else None
        same = trained is not None and default == tuple(trained)
        return [
            _f(
                "warn" if same else "error",
                "layer_ids",
                "no layer ids where "
                + ins.engine.name
                + " reads them"
                + (f" ({', '.join(ignored)} is present but not read)" if ignored else ""),
                f"the engine silently uses its default taps {list(default) if default else '?'}"
                + ("" if same else f"; the draft was trained on boundaries {list(trained) if trained else '?'}"),
                f"write {ins.engine.id_keys[0]} (eaglewire export does)",
            )
        ]
    out = []
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        out.append(
            _f(
                "error",
                "layer_ids",
                f"layer ids {ids} are duplicated or not ascending",
                "engines capture in layer order and deduplicate, so the concatenation differs from training",
                "write strictly ascending ids",
            )
        )
        return out
    if L is None:
        return out
    arch = architecture(ins, target)
    try:
        conv, rule = ins.engine.convention_for(arch), ins.engine.rule_note(arch)
        delivered = from_engine(ids, conv, L)
    except EaglewireError as err:
        return out + [
            _f(
                "error",
                "layer_ids",
                f"{key}={ids} cannot be captured by {ins.engine.name}: {err.what}",
                "the engine would capture fewer or other states than the draft needs",
                err.fix or "",
            )
        ]
    by = f"{ins.engine.name} ({rule})" if rule else ins.engine.name
    n_fc = ins.shapes.get("fc.weight", (0, 0))[1] // max(1, target.hidden_size)
    if n_fc and n_fc != len(ids):
        out.append(
            _f(
                "error",
                "layer_ids",
                f"{len(ids)} layer ids but fc reads {n_fc} taps",
                "the fc input width will not match what the engine concatenates",
                "fix the id list",
            )
        )
    out += _other_readings(ins, ids, tuple(delivered), arch, L)
    if trained is not None and tuple(delivered) != tuple(trained):
        other = [c for c in CONVENTIONS if c not in ("boundary", conv) and decodes(ids, c, L) == tuple(trained)]
        version = f" --engine-version {ins.engine.release}" if rule and ins.engine.release else ""
        out.append(
            _f(
                "error",
                "layer_ids",
                f"{by} will deliver boundaries {list(delivered)}; the draft "
                f"was trained on {list(trained)}"
                + (f" (these are the right ids in the {', '.join(other)} convention)" if other else ""),
                "every tap is off: acceptance falls to ~1 token with no error",
                f"write {list(ins.contract.engine_ids(conv))} (eaglewire wiring translate --layers {L} --taps "
                f"{','.join(map(str, trained))} --to {ins.engine.name}{f' --arch {arch}' if rule else ''}{version})",
            )
        )
    return out


def architecture(ins: Inspection, target: TargetInfo | None) -> str | None:
    """The target's architecture (config `architectures[0]`): what picks SGLang's model file."""
    ident = getattr(target, "identity", None)
    if ident is not None:
        return ident.architecture
    return ins.contract.target.architecture if ins.contract is not None else None


def _other_readings(
    ins: Inspection, ids: list[int], delivered: tuple[int, ...], arch: str | None, L: int
) -> list[Finding]:
    """Warn where another release of the engine (SGLang: of the target's model file) reads the ids otherwise."""
    out, alt = [], ins.engine.other_version
    if alt is not None:
        alt_record = engine_for(alt.convention)
        got = decodes(ids, alt_record.convention_for(arch), L) if _resolvable(alt_record, arch) else delivered
        if got != delivered:
            note = alt_record.rule_note(arch)
            out.append(
                _f(
                    "warn",
                    "layer_ids",
                    f"ids {ids} mean boundaries {list(delivered)} {alt.this_reading} but "
                    f"{list(got or [])} {alt.other_reading}" + (f" ({note})" if note else ""),
                    alt.why,
                    alt.fix,
                )
            )
    if ins.engine.per_model_file:
        for release in SGLANG_RELEASES:
            other = engine_for(ins.engine.name, release)
            if not _resolvable(other, arch) or (got := decodes(ids, other.convention_for(arch), L)) == delivered:
                continue
            out.append(
                _f(
                    "warn",
                    "layer_ids",
                    f"ids {ids} mean boundaries {list(delivered)} under "
                    f"{ins.engine.rule_note(arch)} but {list(got or []) or 'nothing capturable'} under "
                    f"{other.rule_note(arch)}",
                    "SGLang's layer-id rule is per model file and release: "
                    "the same config taps other layers on another release",
                    "pin the SGLang release (eaglewire export --engine-version), or train taps starting at "
                    "boundary 2 (ids starting at 1 read the same under every rule)",
                )
            )
    return out


def _resolvable(record: Engine, arch: str | None) -> bool:
    try:
        record.convention_for(arch)
        return True
    except EaglewireError:
        return False


def decodes(ids: list[int], conv: str, L: int) -> tuple[int, ...] | None:
    try:
        return from_engine(ids, conv, L)
    except EaglewireError:
        return None


def _eagle_taps(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if ins.contract is None or target is None or target.num_layers < 8:
        return []
    if tuple(ins.contract.taps) != default_taps(target.num_layers):
        return [
            _f(
                "error",
                "layer_ids",
                f"SafeAILab EAGLE taps boundaries {list(default_taps(target.num_layers))}, "
                f"the draft was trained on {list(ins.contract.taps)}",
                "EAGLE hard-codes its taps",
                "serve on sglang or vllm, which read layer ids from the config",
            )
        ]
    return []


@check
def fc_width(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    fc = ins.shapes.get("fc.weight")
    if fc is None:
        return [_f("error", "fc", "fc.weight is missing", "the taps cannot be fused", "re-export")]
    out = []
    H = ins.layer_config.get("hidden_size")
    Ht = target.hidden_size if target is not None else H
    n = ins.contract.num_taps if ins.contract else (len(engine_ids(ins)[0] or []) or 3)
    if fc[1] != n * Ht:
        out.append(
            _f(
                "error",
                "fc",
                f"fc reads {fc[1]} channels; {n} taps x {Ht} = {n * Ht} are delivered",
                "the engine's fc cannot take the concatenated taps",
                "retrain/re-export for this target and taps",
            )
        )
    if H is not None and n * Ht == H:
        out.append(
            _f(
                "error",
                "fc",
                f"the concatenated taps ({n * Ht}) are as wide as the draft hidden size ({H})",
                "EAGLE and SGLang apply fc only when widths differ, so they would skip fc silently",
                "use more taps or a different draft width",
            )
        )
    return out


@check
def norm_flags(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    trained = (
        ins.contract.norm.__dict__
        if ins.contract
        else {k: bool(ins.config.get(k)) for k in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")}
    )
    if ins.contract is None and ins.engine.norm_output_is_final_norm:
        trained["norm_output"] = False  # SpecForge's norm_output is its final norm, not post-norm feedback
    out = []
    for flag, on in trained.items():
        if on and flag not in ins.engine.norms:
            out.append(
                _f(
                    "error",
                    "norm_flags",
                    f"the draft was trained with {flag} but {ins.engine.name} does not implement it",
                    "the engine runs a different function with no error",
                    "serve on vllm or retrain",
                )
            )
    if ins.contract is not None:  # what the engine will apply, read from the config, against training
        for flag in sorted(ins.engine.norms):
            said = ins.config.get(flag)
            if ins.engine.norm_output_is_final_norm and flag == "norm_output":
                continue  # SpecForge's norm_output means the final norm: checked below
            if said is not None and bool(said) != bool(trained[flag]):
                out.append(
                    _f(
                        "error",
                        "norm_flags",
                        f"config.json says {flag}: {bool(said)}, but the draft was "
                        f"trained with {flag}: {bool(trained[flag])}",
                        f"{ins.engine.name} applies what the "
                        "config says: a norm the weights never saw (or skips one they need), with no error",
                        "re-export from the native draft (eaglewire export writes the trained flags)",
                    )
                )
    if ins.engine.norm_output_is_final_norm and ins.config.get("norm_output", True) is False:
        out.append(
            _f(
                "error",
                "norm_flags",
                "norm_output: false in a config SpecForge reads",
                "SpecForge reads it as 'no final norm before lm_head' (SGLang: 'feed the pre-norm state "
                "back'), so an SGLang export warm-started in SpecForge is trained/scored without the final norm",
                "eaglewire export --format specforge (writes norm_output: true)",
            )
        )
    if ins.is_speculators and "norm_before_residual" not in ins.config:
        out.append(
            _f(
                "error" if not trained.get("norm_before_residual") else "warn",
                "norm_flags",
                "norm_before_residual is absent from the speculators config",
                "vLLM's speculators path defaults it to True",
                "write it explicitly (eaglewire export does)",
            )
        )
    if ins.is_speculators:
        layer = ins.config.get("transformer_layer_config", {})
        for flag in ("fc_norm", "norm_output"):
            if trained.get(flag) and not layer.get(flag):
                out.append(
                    _f(
                        "warn",
                        "norm_flags",
                        f"{flag} is only at the top level of the speculators config",
                        "some vLLM versions copy only norm_before_fc/norm_before_residual from there",
                        f"also write {flag} inside transformer_layer_config (eaglewire export does)",
                    )
                )
    return out


@check
def target_match(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if target is None:
        return []
    out, lc = [], ins.layer_config
    if lc.get("hidden_size") != target.hidden_size:
        out.append(
            _f(
                "error",
                "target",
                f"draft hidden size {lc.get('hidden_size')} != target {target.hidden_size}",
                "the draft shares the target's embedding and reads its hidden states",
                "pass --target the model the draft was trained for, or train a draft for this target",
            )
        )
    if loaded(target):
        out += _config_match(lc, target.text_config)
    if ins.contract is not None:
        ident = target.identity
        if (
            ins.contract.target.config_sha256 != ident.config_sha256
            or ins.contract.target.num_layers != ident.num_layers
        ):
            out.append(
                _f(
                    "error",
                    "target",
                    f"the draft was trained for {ins.contract.target.name!r} "
                    f"(config {ins.contract.target.config_sha256[:12]}), not this target "
                    f"({ident.config_sha256[:12]})",
                    "its taps describe another model's hidden states",
                    "use the target it was trained for, or train a draft for this one",
                )
            )
        tmpl = target.chat_template_sha256
        if ins.contract.chat_template_sha256 and tmpl != ins.contract.chat_template_sha256:
            out.append(
                _f(
                    "error",
                    "chat_template",
                    "the target's chat template differs from the one the draft was trained with",
                    "the draft sees token contexts it never saw: acceptance drops",
                    "serve with the training template or retrain",
                )
            )
    return out


def _config_match(lc: dict[str, Any], tc: Any) -> list[Finding]:
    """The draft config's rope and context length against the target's config (a dump has no config)."""
    out = []
    rope = getattr(tc, "rope_parameters", None) or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(tc, "rope_theta", None)
    if theta is not None and lc.get("rope_theta") is not None and float(lc["rope_theta"]) != float(theta):
        out.append(
            _f(
                "warn",
                "rope",
                f"draft rope_theta {lc['rope_theta']} != target {theta}",
                "positions are encoded differently from what the target uses",
                "check the draft config",
            )
        )
    if lc.get("rope_scaling"):
        out.append(
            _f(
                "warn",
                "rope",
                f"draft config has rope_scaling {lc['rope_scaling']}",
                "the draft was trained without scaling; engines would apply it",
                "remove rope_scaling",
            )
        )
    tmax = getattr(tc, "max_position_embeddings", None)
    if tmax and lc.get("max_position_embeddings") and lc["max_position_embeddings"] < tmax:
        out.append(
            _f(
                "warn",
                "max_positions",
                f"draft max_position_embeddings {lc['max_position_embeddings']} < target {tmax}",
                "some engines cap the usable context at the draft's",
                "raise it in the config",
            )
        )
    return out


@check
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


@check
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


from eaglewire.doctor.peagle_checks import peagle  # noqa: E402  (a check of its own module, on P-EAGLE only)
from eaglewire.target.protocol import TargetInfo

CHECKS.append(peagle)
