"""The doctor on a GGUF draft as llama.cpp loads it: one finding per knob llama.cpp's converter and loader set
silently (`eaglewire doctor DRAFT.gguf --engine llamacpp`).

What llama.cpp reads is its layout record (export/llamacpp_layout.py), the file is read by
export/gguf_read.py, the training side's truth is the contract side file beside the GGUF (or, given the
target, the measurement: gguf_measure.py); gguf_inspect.py gathers them. The checks shared with every other
format are called, not copied: the vocabulary's (vocab_checks.vocab_map_findings) and the layer-id conventions'
(eaglewire.contract).
"""

from __future__ import annotations

from typing import Callable

import torch

from eaglewire.contract import CANONICAL, CONVENTIONS, to_engine
from eaglewire.doctor.tap_checks import decodes
from eaglewire.doctor.vocab_checks import vocab_map_findings
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.gguf_inspect import GGUFInspection
from eaglewire.errors import EaglewireError
from eaglewire.export.engines import engine_for
from eaglewire.export.gguf_read import GGUFDraft
from eaglewire.export.llamacpp_layout import TARGET_LAYERS, release

RECORD = engine_for("llamacpp")  # llama.cpp's engine record (export/engines.py)
NAME = RECORD.name  # what --engine names it
LLAMACPP = RECORD.convention  # the layer-id convention of a GGUF's <arch>.target_layers (EAGLE-3 and DFlash)
ENGINE = "llama.cpp"  # how messages name it


def _f(level: str, code: str, what: str, why: str, fix: str) -> Finding:
    return Finding(level, code, what, why, fix)


GGUFCheck = Callable[[GGUFInspection], list[Finding]]
GGUF_CHECKS: list[GGUFCheck] = []


def gguf_check(fn: GGUFCheck) -> GGUFCheck:
    GGUF_CHECKS.append(fn)
    return fn


def converter_default(g: GGUFDraft, L: int) -> list[int] | None:
    """What llama.cpp's converter writes when the source config has no top-level ids ([2, n//2, n-3] for
    EAGLE-3, conversion/llama.py; DFlash has no default: layout record's converter_default)."""
    return g.family.default_ids(L) if g.family.default_ids is not None else None


@gguf_check
def gguf_layer_ids(gi: GGUFInspection) -> list[Finding]:
    g, L, key = gi.draft, gi.num_layers, gi.draft.family.key(TARGET_LAYERS)
    ids = g.target_layers
    if ids is None:
        return [
            _f(
                "error",
                "layer_ids",
                f"{key} is absent",
                "llama.cpp refuses to load the draft without the target layers it captures",
                "re-convert: eaglewire export --format llamacpp writes them",
            )
        ]
    if g.family.num_taps is not None and len(ids) != g.family.num_taps:
        return [
            _f(
                "error",
                "layer_ids",
                f"{key} holds {len(ids)} ids: {ids}",
                f"llama.cpp's {g.arch} reads exactly {g.family.num_taps} target layers and aborts otherwise",
                "re-export with that many taps",
            )
        ]
    if L is None:
        return [
            _f(
                "info",
                "layer_ids",
                f"{key} = {ids}, unchecked: the target's depth is unknown",
                "neither a target, a target GGUF nor a contract side file says how many layers the target has",
                "pass --target-gguf TARGET.gguf or --target T",
            )
        ]
    delivered = decodes(ids, LLAMACPP, L)
    if delivered is None:
        return [
            _f(
                "error",
                "layer_ids",
                f"{key} = {ids} cannot be captured by llama.cpp on a {L}-layer target",
                "it captures the input of layer id (0 .. n_layer-1, strictly ascending); id n_layer needs a "
                "next-token head a llama target lacks, larger ids abort",
                "fix the ids",
            )
        ]
    default = converter_default(g, L)
    if gi.trained is not None and delivered != gi.trained:
        return [_trained_mismatch(gi, ids, delivered, default == ids, L)]
    if ids == default and gi.trained is None:
        return [_defaulted(gi, ids, delivered, L)]
    return []


def right_ids_fix(gi: GGUFInspection, L: int, taps: tuple[int, ...]) -> str:
    try:
        return f"write {gi.draft.family.key(TARGET_LAYERS)} = {list(to_engine(taps, LLAMACPP, L))}"
    except EaglewireError as err:
        return f"llama.cpp cannot capture boundaries {list(taps)} ({err.what}): serve on vLLM"


_DEFAULT_WHY = (
    "llama.cpp's converter reads only the draft config's TOP-LEVEL eagle_aux_hidden_state_layer_ids; "
    "a source that nests them (SGLang's eagle_config) or has none gets [2, n//2, n-3] with only an "
    "INFO log line"
)


def _trained_mismatch(
    gi: GGUFInspection, ids: list[int], delivered: tuple[int, ...], is_default: bool, L: int
) -> Finding:
    trained = gi.trained
    assert trained is not None
    other = [c for c in CONVENTIONS if c not in (CANONICAL, LLAMACPP) and decodes(ids, c, L) == trained]
    key = gi.draft.family.key(TARGET_LAYERS)
    if is_default:
        return _f(
            "error",
            "layer_ids",
            f"{key} = {ids} is llama.cpp's converter default, not the draft's taps: "
            f"llama.cpp will deliver boundaries {list(delivered)}, the draft was trained on {list(trained)}",
            _DEFAULT_WHY + ": every tap is off and acceptance falls to ~1 token with no error",
            right_ids_fix(gi, L, trained) + " (eaglewire export --format llamacpp; or convert from the "
            "vLLM export, whose ids are top-level)",
        )
    return _f(
        "error",
        "layer_ids",
        f"{key} = {ids}: llama.cpp will deliver boundaries {list(delivered)}; the "
        f"draft was trained on {list(trained)}"
        + (f" (these are the right ids in the {', '.join(other)} numbering)" if other else ""),
        "llama.cpp captures the INPUT of layer id (boundary id); ids written in another engine's numbering "
        "tap other states: acceptance falls to ~1 token with no error",
        right_ids_fix(gi, L, trained) + " (eaglewire wiring translate --to llamacpp)",
    )


def _defaulted(gi: GGUFInspection, ids: list[int], delivered: tuple[int, ...], L: int) -> Finding:
    key, m = gi.draft.family.key(TARGET_LAYERS), gi.measured
    if m is not None and m.delivered == delivered and m.clearly_worse:
        return _f(
            "error",
            "layer_ids",
            f"{key} = {ids} is llama.cpp's converter default and the draft's weights "
            f"disagree: they predict best from boundaries {list(m.best)}",
            _DEFAULT_WHY + "; the measurement (measured_wiring) says the draft was trained on other taps",
            right_ids_fix(gi, L, m.best),
        )
    return _f(
        "warn",
        "layer_ids",
        f"{key} = {ids} equals llama.cpp's converter default [2, n//2, n-3]; nothing "
        "here says the draft was trained on these taps",
        _DEFAULT_WHY + ", so these may not be the draft's taps",
        f"measure them: eaglewire doctor {gi.draft.path} --engine llamacpp --target T (or keep the "
        "export's eaglewire_contract.json beside the GGUF)",
    )


@gguf_check
def gguf_norms(gi: GGUFInspection) -> list[Finding]:
    """Each norm flag the draft was trained with against the key llama.cpp reads (absent = off)."""
    if gi.contract is None:
        return []
    read = gi.draft.family.norms_read(release(gi.version))
    out, stored = [], {k: v for k, v in gi.draft.norms.items() if k in read}  # what this release reads
    for flag, on in sorted(gi.contract.norm.__dict__.items()):
        if flag not in stored:
            if on:
                out.append(
                    _f(
                        "error",
                        "norm_flags",
                        f"the draft was trained with {flag}; the {gi.draft.arch} of "
                        f"llama.cpp {release(gi.version).version} does not implement it",
                        "it runs another function than the one trained, with no error",
                        "serve on vLLM, on a llama.cpp "
                        "release that reads the flag (--engine-version), or train without it",
                    )
                )
        elif bool(stored[flag]) != on:
            said = "absent" if stored[flag] is None else str(bool(stored[flag])).lower()
            out.append(
                _f(
                    "error",
                    "norm_flags",
                    f"{gi.draft.arch}.{flag} is {said}; the draft was trained with {flag}: {str(on).lower()}",
                    "llama.cpp applies what the GGUF says: "
                    + ("a norm the source had is lost" if on else "a norm the weights never saw"),
                    "re-export: eaglewire export --format llamacpp writes every flag llama.cpp reads",
                )
            )
    return out


@gguf_check
def gguf_vocab(gi: GGUFInspection) -> list[Finding]:
    """The vocabulary as llama.cpp reads it, through the one check every format shares. GGUF stores d2t as
    ABSOLUTE target ids: they are turned back into offsets for the shared check, and a d2t that holds our
    offsets instead (duplicated ids, or offsets the contract's map gives) is named."""
    g, V = gi.draft, gi.vocab_size
    head = g.tensor_shapes.get(g.family.gguf_name("lm_head.weight") or "")
    absolute = g.d2t_absolute
    if head is None and absolute is None:
        return []  # DFlash without a head of its own shares the target's: nothing to map
    out = []
    if absolute is not None and _holds_offsets(gi, absolute):
        out.append(
            _f(
                "error",
                "d2t",
                "d2t holds offsets (target id - draft index), not the absolute target ids llama.cpp reads",
                "llama.cpp scatters draft row i to target token d2t[i]: every drafted token is another token",
                "re-export (eaglewire export --format llamacpp), or "
                "convert with llama.cpp's converter, which adds arange",
            )
        )
        return out
    offsets = absolute - torch.arange(absolute.numel()) if absolute is not None else None
    vd = g.draft_vocab_size
    return out + vocab_map_findings(V, vd, head, offsets, None)


def _holds_offsets(gi: GGUFInspection, d2t: torch.Tensor) -> bool:
    if torch.unique(d2t).numel() != d2t.numel():
        return True  # absolute ids are a set; offsets of a sorted map repeat wherever ids run consecutively
    if gi.contract is None or gi.contract.draft_vocab_size != d2t.numel():
        return False
    from eaglewire.draft.vocab import vocab_map_sha256

    V = gi.contract.target.vocab_size
    return vocab_map_sha256(d2t, V) == gi.contract.vocab_map_sha256  # the stored values ARE the map's offsets


@gguf_check
def gguf_target(gi: GGUFInspection) -> list[Finding]:
    """The draft against the target it will be served with: hidden size, depth, vocabulary (token texts)."""
    g, out = gi.draft, []
    fc = g.tensor_shapes.get("fc.weight")
    n = len(g.target_layers or []) or None
    for source, name in ((gi.target_gguf, "the target GGUF"), (gi.target, "the target")):
        if source is None:
            continue
        H, V = source.hidden_size, source.vocab_size
        width = g.target_hidden_size or (fc[1] // n if fc and n else None)
        if H is not None and width is not None and width != H:
            out.append(
                _f(
                    "error",
                    "target",
                    f"the draft reads target states {width} wide; {name} has hidden size {H}",
                    "its fc cannot take the target's states: llama.cpp refuses the pair or misreads them",
                    "serve the draft with the target it was trained for",
                )
            )
        if V is not None and g.vocab_size is not None and g.vocab_size != V:
            out.append(
                _f(
                    "error",
                    "target",
                    f"the draft's vocabulary has {g.vocab_size} tokens; {name} has {V}",
                    "the draft embeds and names tokens of another vocabulary",
                    "serve the draft with the target it was trained for",
                )
            )
        if (
            gi.contract is not None
            and source.num_layers is not None
            and gi.contract.target.num_layers != source.num_layers
        ):
            out.append(
                _f(
                    "error",
                    "target",
                    f"the draft was trained for a {gi.contract.target.num_layers}-layer "
                    f"target ({gi.contract.target.name!r}); {name} has {source.num_layers} layers",
                    "its taps describe another model's hidden states",
                    "serve it with the target it was trained for, or train a draft for this one",
                )
            )
    return out + _tokenizer_match(gi)


def _tokenizer_match(gi: GGUFInspection) -> list[Finding]:
    from eaglewire.export.gguf_read import TOKENIZER_KEYS

    tg, g = gi.target_gguf, gi.draft
    if tg is None or g.tokens is None or tg.tokens is None:
        return []
    differ = [k for k in TOKENIZER_KEYS if g.metadata.get(k) != tg.metadata.get(k)]
    if list(g.tokens) != list(tg.tokens):
        differ.append("tokenizer.ggml.tokens")
    if not differ:
        return []
    return [
        _f(
            "error",
            "target",
            f"the draft's vocabulary differs from the target GGUF's ({', '.join(differ)})",
            "llama-server checks that draft and target share one vocabulary and refuses the pair; tokens "
            "would otherwise mean other text",
            "convert the draft with --target-model-dir set to this "
            "target's HF directory (eaglewire export --format llamacpp --target T)",
        )
    ]


@gguf_check
def gguf_block(gi: GGUFInspection) -> list[Finding]:
    """A block drafter's (DFlash) knobs against the contract: block size, mask token, causal flag, window."""
    block = gi.contract.block if gi.contract is not None else None
    g = gi.draft
    if block is None or not g.family.block:
        return []
    out = []
    trained_causal = bool(block.causal)  # None: full-attention layers see the whole block (non-causal)
    stored_causal = bool(g.causal)  # absent: llama.cpp's DFlash attends non-causally
    pairs = (
        (
            "block_size",
            block.block_size,
            g.block_size,
            "proposes block_size - 1 tokens per pass and places the mask slots by it",
        ),
        (
            "mask_token_id",
            block.mask_token_id,
            g.mask_token_id,
            "fills the block's slots with this token's embedding: another token is an input the draft never saw",
        ),
        ("causal", trained_causal, stored_causal, "attends inside the block as the flag says"),
    )
    for name, want, have, why in pairs:
        if want != have:
            out.append(
                _f(
                    "error",
                    "block",
                    f"the GGUF's {name} is {have!r}; the draft was trained with {want!r}",
                    f"llama.cpp {why}: the draft runs another function than trained, with no error",
                    "re-export: eaglewire export --format llamacpp writes the contract's values",
                )
            )
    if block.sliding_layers and g.sliding_window != block.sliding_window:
        out.append(
            _f(
                "error",
                "block",
                f"the GGUF's sliding window is {g.sliding_window!r}; the draft's "
                f"sliding layers were trained with {block.sliding_window}",
                "its sliding layers see another context",
                "re-export with the window",
            )
        )
    return out


@gguf_check
def gguf_contract(gi: GGUFInspection) -> list[Finding]:
    if gi.contract is not None:
        return []
    return [
        _f(
            "info",
            "contract",
            "no eaglewire_contract.json beside the GGUF: the training-side truth is unknown",
            "target layers and norms can only be checked for internal consistency, or measured",
            f"give --target to measure the trained boundaries (eaglewire doctor {gi.draft.path} --engine "
            "llamacpp --target T), or keep the export's contract file beside the GGUF",
        )
    ]


def gguf_findings(gi: GGUFInspection) -> list[Finding]:
    return [f for check in GGUF_CHECKS for f in check(gi)]
