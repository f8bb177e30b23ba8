"""The block-drafter slot checks (DFlash, DFlash2, DSpark): how the engine runs the draft's block against how it
was trained: the RoPE layout of its positions, the block size and the engine's draft count, the mask token of its
slots, its attention (sliding window, causal), and where the anchor sits. Findings name the engine behaviour and
the PR or issue it comes from.
"""

from __future__ import annotations

from eaglewire.doctor.block_inspect import BlockInspection
from eaglewire.doctor.findings import Finding


def block_rope(ins: BlockInspection) -> list[Finding]:
    layer = ins.layer
    neox = [layer.get(k, ins.config.get(k)) for k in ("is_neox_style", "rope_is_neox_style")]
    off = any(v is False for v in neox)
    src = ins.rule["rope_from"]
    if off and src == "draft":
        return [
            Finding(
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
            Finding(
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
            Finding(
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


def block_size(ins: BlockInspection) -> list[Finding]:
    b, at = _config_block(ins)
    trained = ins.contract.block.block_size if ins.contract is not None and ins.contract.block else None
    out = []
    if b is None:
        out.append(
            Finding(
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
            Finding(
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
            Finding(
                "error",
                "block_size",
                f"block_size {top} (top level) and dflash_config.block_size {inner} disagree",
                "SGLang reads dflash_config first, other readers the top level: the two engines run different blocks",
                "keep one value, in both places",
            )
        )
    return out


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
            Finding(
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
            Finding(
                "info",
                "block_knobs",
                f"the engine's knobs draft {ins.drafts} of the {want} tokens a block of {size} can draft",
                "a shorter block is served correctly; the later positions are left unused",
                f"{knob} drafts the whole block (worth it where acceptance at those positions pays)",
            )
        ]
    return []


def block_mask_token(ins: BlockInspection) -> list[Finding]:
    dflash = ins.config.get("dflash_config") if isinstance(ins.config.get("dflash_config"), dict) else {}
    m = dflash.get("mask_token_id", ins.config.get("mask_token_id"))
    trained = ins.contract.block.mask_token_id if ins.contract is not None and ins.contract.block else None
    V = ins.target_vocab
    if m is None:
        return [
            Finding(
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
            Finding(
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
            Finding(
                "error",
                "block_mask_token",
                f"mask_token_id is {m}, but the draft was trained with {trained}",
                "every mask slot is embedded as another token: the draft drafts from the wrong input and "
                "accepts almost nothing, with no error",
                f"set mask_token_id to {trained}",
            )
        ]
    return []


def block_attention(ins: BlockInspection) -> list[Finding]:
    out = []
    types = ins.layer.get("layer_types")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"] if isinstance(types, list) else []
    if sliding and ins.rule.get("layer_types_read") is False:
        out.append(
            Finding(
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
            Finding(
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


def block_anchor(ins: BlockInspection) -> list[Finding]:
    sfa = ins.config.get("sample_from_anchor")
    trained = ins.contract.block.anchor_layout if ins.contract is not None and ins.contract.block else None
    out = []
    if ins.record.vllm_anchor_default_differs and ins.layout == "speculators" and ins.engine == "vllm" and sfa is None:
        out.append(
            Finding(
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
            Finding(
                "error",
                "block_anchor",
                f"sample_from_anchor is {sfa}, the draft was trained with the {trained} layout",
                "slot k then predicts another position than in training (p+k vs p+k+1)",
                f"set sample_from_anchor to {str(trained == 'anchor_first').lower()}",
            )
        )
    return out
