"""The layer-id conventions engines write taps in, one record each: what boundaries a convention can express (its
lowest, whether it reaches the last layer's output), the names retired because they denote no single rule, and
the refusal that names a tap an engine cannot capture and why.

Which id a convention writes for a boundary (the off-by-one) is not here: contract.py's `_id_offset` holds it, the
one place a layer id is shifted, and its docstring's table gives both columns per engine, read from each engine's
source. contract.py translates with these records (`to_engine`, `from_engine`) and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.errors import TranslationError
from eaglewire.taps import default_taps

CANONICAL = "boundary"
HOOKED = "modelopt"  # a forward hook on decoder layer id captures its output, boundary id + 1 (ModelOpt's numbering)


@dataclass(frozen=True)
class Convention:
    name: str
    summary: str
    min_boundary: int  # 0 if the engine can tap the embedding output
    reaches_final: bool  # True if the engine can tap boundary L (last layer output, pre-norm)


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in [
        Convention(CANONICAL, "eaglewire boundaries (b=0 embedding, b=k output of layer k-1)", 0, True),
        Convention("hf", "transformers output_hidden_states index (entry L is post-norm)", 0, False),
        Convention("vllm", "vLLM eagle_aux_hidden_state_layer_ids, used raw (EagleModelMixin)", 0, True),
        Convention("speculators", "speculators eagle_aux_hidden_state_layer_ids (vLLM meaning)", 0, True),
        Convention("vllm-legacy", "vLLM before EagleModelMixin: raw ids, 1..L-1 only", 1, False),
        Convention("sglang-plus1", "SGLang model files that always add 1 (llama.py, qwen*.py, ...)", 1, False),
        Convention(
            "sglang-first1",
            "SGLang model files that add 1 only if the first id is 1 (PR #25454: deepseek_v2.py, glm4_moe_lite.py)",
            1,
            False,
        ),
        Convention("sglang-final", "SGLang gpt_oss.py: ids as is when the last is L, else +1", 1, True),
        # SpecForge's HF backend hooks the output of layer id (so L is reachable there); its SGLang
        # backend cannot capture b=L, which the sglang conventions refuse at export time. SpecForge 0.2.0
        # removed the HF backend and captures through SGLang's set_eagle3_layers_to_capture, so its ids
        # then follow the pinned SGLang's rule; both readings agree when the first tap is boundary 2
        # (id 1), the default. The doctor warns when they would not.
        Convention("specforge", "SpecForge ids (output of layer id; HF backend forward hooks)", 1, True),
        Convention("modelopt", "ModelOpt ids (forward hook on decoder layer id)", 1, True),
        Convention("eagle", "SafeAILab EAGLE: hard-coded hidden_states[2, L//2, L-3]", 1, False),
        # DFlash's target_layer_ids: id k = output of decoder layer k (z-lab reads hidden_states[k+1], which
        # is post-norm at k = L-1; SGLang captures before layer k+1, so not after the last one either)
        Convention("zlab", "DFlash target_layer_ids (z-lab, SpecForge): id k = output of layer k", 1, False),
        Convention("sglang-dflash", "SGLang DFLASH target_layer_ids: +1 always (capture before k+1)", 1, False),
        Convention(
            "sglang-dflash-asis",
            "SGLang model files whose set_dflash_layers_to_capture keeps the ids "
            "(export/sglang_rules.json rule as-is): captured before layer k",
            1,
            False,
        ),
        Convention("vllm-dflash", "vLLM dflash_config.target_layer_ids: +1 (PR #40727)", 1, True),
        Convention(
            "deepspec",
            "DeepSpec target_layer_ids (a trainer the doctor reads): id k = output of layer k, -1 = embedding",
            0,
            False,
        ),
        # llama.cpp captures the INPUT of layer id; id L reads t_h_nextn, never set for a llama target: L refused
        Convention("llamacpp", "llama.cpp GGUF <arch>.target_layers: the input of layer id", 0, False),
    ]
}


# Names that no longer denote one rule: what each meant and what to use instead.
RETIRED = {
    "sglang": (
        "SGLang's layer-id rule depends on the target's model file and the SGLang release",
        "name the target's architecture (--arch, or --target), which resolves sglang-plus1, "
        "sglang-first1 or sglang-final (eaglewire.export.sglang_rules)",
    ),
    "sglang-legacy": (
        "'always +1' was never a release-wide SGLang rule: llama.py and qwen*.py always add 1 in "
        "every release, deepseek_v2.py did before 0.5.13",
        "use sglang-plus1, or name the "
        "architecture (--arch) and the release (--engine-version) and let the SGLang record pick",
    ),
}


def get_convention(name: str) -> Convention:
    if name in RETIRED:
        why, fix = RETIRED[name]
        raise TranslationError(
            f"{name!r} names no single layer-id rule: {why}", expected=", ".join(CONVENTIONS), found=name, fix=fix
        )
    if name not in CONVENTIONS:
        raise TranslationError(f"unknown layer-id convention {name!r}", expected=", ".join(CONVENTIONS), found=name)
    return CONVENTIONS[name]


def _refuse(engine: str, tap: int, why: str, fix: str) -> TranslationError:
    return TranslationError(
        f"{engine} cannot express tap boundary {tap}: {why}",
        expected=f"taps that {engine} can capture",
        found=f"boundary {tap}",
        fix=fix,
    )


def check_expressible(conv: Convention, taps: tuple[int, ...], num_layers: int) -> None:
    """Raise naming the tap, the engine and the reason if `conv` cannot capture `taps`."""
    name = conv.name
    if taps[0] < conv.min_boundary:
        raise _refuse(
            name,
            taps[0],
            "boundary 0 is the embedding output, and this engine's capture "
            "loop records hidden + residual before each layer (residual is None before layer 0)",
            "tap boundaries >= 1, or serve on vLLM (EagleModelMixin captures id 0)",
        )
    if taps[-1] == num_layers and not conv.reaches_final:
        why = (
            f"output_hidden_states[{num_layers}] is AFTER the final norm, not the residual boundary"
            if name == "hf"
            else "its capture loop records states before each decoder layer and never after the last one"
        )
        raise _refuse(
            name,
            num_layers,
            why,
            f"tap boundaries <= {num_layers - 1}, or serve on vLLM "
            "(id L captures the final boundary) / use eaglewire's hook capture",
        )
    if name == "sglang-first1" and taps[0] == 1:
        raise _refuse(
            name,
            1,
            "under the PR #25454 rule a first id of 1 is shifted to boundary 2, and "
            "a first id of 0 is not shifted (embedding)",
            "start the taps at boundary >= 2, or "
            "serve on an SGLang release or model file that always adds 1 (sglang-plus1)",
        )
    if name == "eagle" and taps != default_taps(num_layers):
        raise _refuse(
            name,
            taps[0],
            f"SafeAILab EAGLE hard-codes boundaries {list(default_taps(num_layers))} and has no layer-id setting",
            "export to sglang or vllm, which read layer ids from the config",
        )
