"""A DFlash draft's wiring contract: its block (size, mask token) and its vocabulary on a target's contract,
z-lab's default taps, and the mask token chosen for a tokenizer.

Apart from the model (draft/dflash.py): what a block drafter is wired as is decided before any draft exists
(training picks the mask token and the taps, importers rebuild the contract from an export's config), and none of
it reads the draft's weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eaglewire.contract import WiringContract, from_engine
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import CheckpointError
from eaglewire.families import BlockWiring, zlab_default_ids
from eaglewire.target.protocol import TargetInfo, TargetTensors


def dflash_contract(
    target: TargetInfo, taps: tuple[int, ...], block: BlockWiring, vmap: VocabMap | None = None
) -> WiringContract:
    """The contract of a DFlash draft for `target` (anything with .contract(taps)): the full vocabulary (no
    d2t), or the reduced one `vmap` names (its size and hash, as an EAGLE-3 draft's)."""
    base = target.contract(tuple(taps))
    size, sha = (base.target.vocab_size, None) if vmap is None else (vmap.draft_vocab_size, vmap.sha256())
    return dataclasses.replace(base, family="dflash", block=block, draft_vocab_size=size, vocab_map_sha256=sha)


def default_dflash_contract(
    target: TargetTensors, block_size: int, *, taps: tuple[int, ...] | None = None, num_taps: int = 5
) -> WiringContract:
    """A DFlash contract for a loaded target (with its tokenizer): the mask token `pick_mask_token` chooses, and
    taps given as boundaries or, by default, z-lab's `num_taps` (`build_target_layer_ids`, as boundaries)."""
    if taps is None:
        taps = from_engine(zlab_default_ids(target.num_layers, num_taps), "zlab", target.num_layers)
    return dflash_contract(target, taps, BlockWiring(block_size, pick_mask_token(target.tokenizer)))


# Tokens a tokenizer reserves that chat data never contains, in order of preference: a declared mask token,
# then the last of the added special tokens that no chat template or document boundary uses.
_NEVER_MASK = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token")


def pick_mask_token(tokenizer: Any) -> int:
    """The mask token of a DFlash draft for this tokenizer: its own mask token (`<|MASK|>` or mask_token) if it
    has one, else its highest-id added special token that is not bos/eos/pad/unk and is not in the chat
    template (SmolLM2: 16 `<empty_output>`, a Jupyter marker of its pre-training code data). The id must be a
    row of the embedding, which a reserved token always is, so engines load it with no extra file."""
    vocab = tokenizer.get_vocab()
    for name in ("<|MASK|>", getattr(tokenizer, "mask_token", None)):
        if name and name in vocab:
            return int(vocab[name])
    used = {getattr(tokenizer, a, None) for a in _NEVER_MASK}
    template = getattr(tokenizer, "chat_template", None) or ""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    candidates = [
        i
        for i, tok in added.items()
        if getattr(tok, "special", False) and tok.content not in used and tok.content not in template
    ]
    if not candidates:
        raise CheckpointError(
            "the tokenizer has no mask token and no spare special token",
            expected="a <|MASK|> token or an unused added special token",
            found="none",
            fix="pass an explicit mask token id (an id no training text contains)",
        )
    return int(max(candidates))
