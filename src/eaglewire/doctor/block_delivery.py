"""What an engine delivers to a block drafter (DFlash, DFlash2, DSpark): the boundaries it captures from the
config field it reads (`delivery`), under the engine rule block_inspect.py found for its version, or its guess
when the config names no ids. Read without trusting the config: an oddity becomes a Delivery that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.contract import CANONICAL, renumber
from eaglewire.doctor.block_inspect import BlockInspection, field_convention
from eaglewire.errors import TranslationError
from eaglewire.families import zlab_default_ids

_DFLASH_IDS, _AUX_IDS = "dflash_config.target_layer_ids", "eagle_aux_hidden_state_layer_ids"


def sglang_guess(ins: BlockInspection) -> list[int] | None:
    """SGLang's ids when a config has none: build_target_layer_ids(L, number of DRAFT layers) (sglang #37475)."""
    if ins.target_layers is None or ins.num_draft_layers is None or ins.target_layers < 4:
        return None
    return list(zlab_default_ids(ins.target_layers, ins.num_draft_layers))


@dataclass(frozen=True)
class Delivery:
    boundaries: tuple[int, ...] | None  # None: the engine refuses to load, or eaglewire cannot say
    field: str  # the config field the engine took them from
    how: str  # the engine behaviour applied, with its source
    guessed: bool = False  # the ids were missing and the engine made them up


def _vllm_delivery(ins: BlockInspection) -> Delivery:
    r, L = ins.rule, ins.target_layers
    if ins.layout == "speculators":
        aux = ins.ids("aux_hidden_state_layer_ids")
        if aux is None:
            return Delivery(None, "aux_hidden_state_layer_ids", "vLLM's speculators updater requires it (KeyError)")
        return Delivery(
            tuple(aux),
            "aux_hidden_state_layer_ids",
            "vLLM's update_dflash copies them as is to "
            "eagle_aux_hidden_state_layer_ids, which its runner captures as is",
        )
    for at in ("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"):
        if ins.ids(at) is not None:
            return Delivery(
                tuple(ins.ids(at) or ()),
                at,
                "vLLM's runner reads it first and as is "
                "(_get_eagle3_aux_layers_from_config): it wins over dflash_config.target_layer_ids",
            )
    at = "target_layer_ids" if ins.layout == "deepspec" else "dflash_config.target_layer_ids"
    ids = ins.ids(at)
    if ids is not None:
        plus = bool(r["dflash_ids_plus_one"])  # before PR #40727 vLLM read them as it reads eagle aux ids
        conv = field_convention("vllm", _DFLASH_IDS if plus else _AUX_IDS)
        return Delivery(
            renumber(ids, conv, CANONICAL, L),
            at,
            f"vLLM {ins.version} "
            f"captures id + {int(plus)}"
            + (" (PR #40727, vLLM 0.22 on)" if plus else " (before PR #40727: vLLM 0.20 and 0.21)"),
        )
    if L is None:
        return Delivery(None, "(none)", "no layer ids, and no target to find vLLM's default on", guessed=True)
    return Delivery(
        (2, L // 2, L - 3),
        "(none)",
        "no layer ids: vLLM falls back to the target's EAGLE-3 default "
        "(2, L//2, L-3) with only an info log (vLLM #50170)",
        guessed=True,
    )


def _sglang_delivery(ins: BlockInspection) -> Delivery:
    from eaglewire.export.sglang_rules import DFLASH_CONVENTIONS, rule_for

    at = "dflash_config.target_layer_ids"
    ids = ins.ids(at) if ins.layout != "speculators" else None
    if ids is None and ins.layout != "speculators" and ins.ids("target_layer_ids") is not None:
        at, ids = "target_layer_ids", ins.ids("target_layer_ids")
    guessed = ids is None
    if guessed:
        ids, at = sglang_guess(ins), "(none)"
        if ids is None:
            return Delivery(None, at, "no layer ids, and no target to find SGLang's guess on", guessed=True)
    try:
        rule = rule_for(ins.target_arch, ins.version, kind="dflash")
    except TranslationError as err:
        return Delivery(None, at, f"SGLang's shift is per model file and unknown here: {err.args[0]}", guessed)
    conv = DFLASH_CONVENTIONS.get(rule.rule)
    if conv is None:
        return Delivery(None, at, f"{rule.describe()} reads DFlash ids in a way eaglewire has not recorded", guessed)
    how = f"{rule.describe()} set_dflash_layers_to_capture: captures id + {renumber((0,), conv, CANONICAL, None)[0]}"
    if guessed:
        how = (
            "no layer ids: SGLang guesses build_target_layer_ids(L, number of draft layers) silently "
            f"(sglang #37475), then {how}"
        )
    return Delivery(renumber(ids or (), conv, CANONICAL, ins.target_layers), at, how, guessed)


def delivery(ins: BlockInspection) -> Delivery:
    return _vllm_delivery(ins) if ins.engine == "vllm" else _sglang_delivery(ins)
