"""The block-drafter tap checks (DFlash, DFlash2, DSpark): which boundaries the engine captures from the ids it
reads (block_delivery.py) against those the draft was trained on, the ids missing (the engine then guesses), and
the eagle aux ids vLLM reads before the DFlash ones. Findings name the engine behaviour and the PR or issue it
comes from.
"""

from __future__ import annotations

from eaglewire.contract import renumber
from eaglewire.doctor.block_delivery import Delivery, delivery
from eaglewire.doctor.block_inspect import BlockInspection, field_convention
from eaglewire.doctor.findings import Finding

_IDS, _AUX = "dflash_config.target_layer_ids", "eagle_aux_hidden_state_layer_ids"


def block_read(ins: BlockInspection) -> list[Finding]:
    trained, source = ins.trained()
    d = delivery(ins)
    return [
        Finding(
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


def block_taps(ins: BlockInspection) -> list[Finding]:
    trained, source = ins.trained()
    d = delivery(ins)
    if d.guessed:
        return _missing_ids(ins, d, trained)
    if d.boundaries is None:
        return [_undelivered(d)]
    out = _uncapturable(ins, d)
    if trained is None or out or tuple(d.boundaries) == tuple(trained):
        return out
    return [_off_taps(ins, d, trained, source)]


def _undelivered(d: Delivery) -> Finding:
    """The engine's boundaries could not be worked out: it fails to load the draft, or the doctor cannot say."""
    if "KeyError" in d.how:
        return Finding(
            "error",
            "block_ids_missing",
            f"{d.field} is missing",
            d.how + ": the draft does not load",
            "re-export the draft (eaglewire import DIR --target T, then eaglewire export --format vllm)",
        )
    return Finding(
        "warn",
        "block_taps",
        "the boundaries the engine captures could not be worked out",
        d.how,
        "pass --target (or --engine-version) so the doctor knows the target's model file",
    )


def _uncapturable(ins: BlockInspection, d: Delivery) -> list[Finding]:
    """Boundaries the engine cannot capture for this draft: another count than fc reads, or outside the target."""
    out = []
    n = ins.num_taps
    if n is not None and n != len(d.boundaries):
        out.append(
            Finding(
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
            Finding(
                "error",
                "block_taps",
                f"{ins.engine} would capture boundaries {list(d.boundaries)} of a {L}-layer target",
                "an id outside the target: the engine refuses the draft or indexes another layer",
                "write the ids in the engine's numbering (eaglewire wiring translate)",
            )
        )
    return out


def _off_taps(ins: BlockInspection, d: Delivery, trained: tuple[int, ...], source: str) -> Finding:
    """The engine captures other boundaries than the draft was trained on (by a constant shift, said so)."""
    k = _shift(tuple(d.boundaries), tuple(trained))
    what = (
        f"{ins.engine} {ins.version} captures boundaries {list(d.boundaries)} from {d.field}, "
        f"but the draft was trained on {list(trained)} (from {source})" + (f": every tap off by {k:+d}" if k else "")
    )
    return Finding(
        "error",
        "block_taps",
        what,
        f"{d.how}; the draft then reads other layers than it was trained on: "
        "it loads, serves correct text, and accepts almost nothing",
        f"re-export for this engine and version (eaglewire export --format {ins.engine}), or write "
        f"{d.field} in {ins.engine}'s numbering (eaglewire wiring translate --family {ins.family})",
    )


def _missing_ids(ins: BlockInspection, d: Delivery, trained: tuple[int, ...] | None) -> list[Finding]:
    n = ins.num_taps
    if ins.layout == "speculators" and ins.engine == "sglang":
        aux, L = ins.ids("aux_hidden_state_layer_ids") or [], ins.target_layers
        speculators, sglang = field_convention("vllm", "aux_hidden_state_layer_ids"), field_convention("sglang", _IDS)
        return [
            Finding(
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
            Finding(
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
            Finding(
                "warn",
                "block_ids_missing",
                f"the config names no target layer ids; {ins.engine}'s guess "
                f"{list(d.boundaries)} happens to be the trained taps",
                d.how,
                "write the ids explicitly: the guess changes with the target's depth and the draft's layers",
            )
        ]
    return [
        Finding(
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
        Finding(
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
