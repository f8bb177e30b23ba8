"""The tap checks of an EAGLE-3 export: which boundaries the engine's layer ids deliver (under this release's
rule and under the other readings of the same ids), against the boundaries the draft was trained on, and whether
fc is as wide as the taps it fuses. A layer id is shifted only by contract.py (`from_engine`).
"""

from __future__ import annotations

from eaglewire.contract import CONVENTIONS, default_taps, from_engine
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.errors import EaglewireError
from eaglewire.export.engines import IDS_KEY, NESTED_IDS_KEY, Engine, engine_for
from eaglewire.export.sglang_rules import RELEASES as SGLANG_RELEASES
from eaglewire.target.protocol import TargetInfo


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


def layer_ids(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    if ins.engine.hard_coded_taps:
        return _eagle_taps(ins, target)
    L = target.num_layers if target is not None else None
    ids, key, ignored = engine_ids(ins)
    if ids is None:
        return [_no_ids(ins, L, ignored)]
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        return [
            Finding(
                "error",
                "layer_ids",
                f"layer ids {ids} are duplicated or not ascending",
                "engines capture in layer order and deduplicate, so the concatenation differs from training",
                "write strictly ascending ids",
            )
        ]
    if target is None or L is None:
        return []
    return _delivered_findings(ins, target, ids, key, L)


def _no_ids(ins: Inspection, L: int | None, ignored: list[str]) -> Finding:
    """No ids where the engine reads them: it taps its defaults, an error unless those are the trained ones."""
    trained = ins.contract.taps if ins.contract else None
    default = default_taps(L) if L and L >= 8 else None
    same = trained is not None and default == tuple(trained)
    return Finding(
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


def _delivered_findings(ins: Inspection, target: TargetInfo, ids: list[int], key: str | None, L: int) -> list[Finding]:
    """The boundaries the engine's rule delivers for well-formed `ids`: against fc's width, against the other
    readings of the same ids, and against the boundaries the draft was trained on."""
    arch = architecture(ins, target)
    try:
        conv, rule = ins.engine.convention_for(arch), ins.engine.rule_note(arch)
        delivered = from_engine(ids, conv, L)
    except EaglewireError as err:
        return [
            Finding(
                "error",
                "layer_ids",
                f"{key}={ids} cannot be captured by {ins.engine.name}: {err.what}",
                "the engine would capture fewer or other states than the draft needs",
                err.fix or "",
            )
        ]
    out = []
    n_fc = ins.shapes.get("fc.weight", (0, 0))[1] // max(1, target.hidden_size)
    if n_fc and n_fc != len(ids):
        out.append(
            Finding(
                "error",
                "layer_ids",
                f"{len(ids)} layer ids but fc reads {n_fc} taps",
                "the fc input width will not match what the engine concatenates",
                "fix the id list",
            )
        )
    out += _other_readings(ins, ids, tuple(delivered), arch, L)
    if ins.contract is not None and tuple(delivered) != tuple(ins.contract.taps):
        out.append(_off_taps(ins, ids, tuple(delivered), conv, rule, arch, L))
    return out


def _off_taps(
    ins: Inspection, ids: list[int], delivered: tuple[int, ...], conv: str, rule: str, arch: str | None, L: int
) -> Finding:
    """The ids deliver other boundaries than the draft was trained on: the ids to write (under the engine's
    convention `conv`, its rule note `rule`), and the convention in which the ids written would have been right."""
    trained = ins.contract.taps
    by = f"{ins.engine.name} ({rule})" if rule else ins.engine.name
    other = [c for c in CONVENTIONS if c not in ("boundary", conv) and decodes(ids, c, L) == tuple(trained)]
    version = f" --engine-version {ins.engine.release}" if rule and ins.engine.release else ""
    return Finding(
        "error",
        "layer_ids",
        f"{by} will deliver boundaries {list(delivered)}; the draft "
        f"was trained on {list(trained)}"
        + (f" (these are the right ids in the {', '.join(other)} convention)" if other else ""),
        "every tap is off: acceptance falls to ~1 token with no error",
        f"write {list(ins.contract.engine_ids(conv))} (eaglewire wiring translate --layers {L} --taps "
        f"{','.join(map(str, trained))} --to {ins.engine.name}{f' --arch {arch}' if rule else ''}{version})",
    )


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
                Finding(
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
                Finding(
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
            Finding(
                "error",
                "layer_ids",
                f"SafeAILab EAGLE taps boundaries {list(default_taps(target.num_layers))}, "
                f"the draft was trained on {list(ins.contract.taps)}",
                "EAGLE hard-codes its taps",
                "serve on sglang or vllm, which read layer ids from the config",
            )
        ]
    return []


def fc_width(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    fc = ins.shapes.get("fc.weight")
    if fc is None:
        return [Finding("error", "fc", "fc.weight is missing", "the taps cannot be fused", "re-export")]
    out = []
    H = ins.layer_config.get("hidden_size")
    Ht = target.hidden_size if target is not None else H
    n = ins.contract.num_taps if ins.contract else (len(engine_ids(ins)[0] or []) or 3)
    if fc[1] != n * Ht:
        out.append(
            Finding(
                "error",
                "fc",
                f"fc reads {fc[1]} channels; {n} taps x {Ht} = {n * Ht} are delivered",
                "the engine's fc cannot take the concatenated taps",
                "retrain/re-export for this target and taps",
            )
        )
    if H is not None and n * Ht == H:
        out.append(
            Finding(
                "error",
                "fc",
                f"the concatenated taps ({n * Ht}) are as wide as the draft hidden size ({H})",
                "EAGLE and SGLang apply fc only when widths differ, so they would skip fc silently",
                "use more taps or a different draft width",
            )
        )
    return out
