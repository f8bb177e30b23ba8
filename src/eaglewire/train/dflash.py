"""DFlash's training record: its contract, the block draft (draft/dflash.py) and the block objective
(train/block.py); it is saved and resumed in the native checkpoint (family-keyed). train/objectives.py keys it by
family name.

A DFlash draft predicts over the target's full vocabulary through the target's own head (no d2t), or, given a
vocab map (`--vocab`), over that reduced vocabulary through its own head started from the target's rows (the
layout vLLM's DFlash loader and speculators' DFlash model read: lm_head, d2t, t2d); its block size and mask
token are the contract's (`BlockWiring`), and the training knobs that shape the contract (`block_size`) must
agree with it. EAGLE-3's warm-start, feature and round-weight knobs have no meaning here and are refused
rather than ignored.
"""

from __future__ import annotations

from typing import Any

import torch

from eaglewire.contract import WiringContract, from_engine
from eaglewire.draft.dflash import DFlashDraft, build_dflash_draft
from eaglewire.draft.dflash_contract import dflash_contract, pick_mask_token
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import ContractMismatch
from eaglewire.families import BlockWiring, zlab_default_ids
from eaglewire.train.block import BlockModel
from eaglewire.train.config import TrainConfig
from eaglewire.train.dist import DistInfo, all_reduce_sum
from eaglewire.train.warm import copy_target_layer
from eaglewire.target.protocol import TargetTensors

DEFAULT_NUM_TAPS = 5  # z-lab's drafts, SpecForge's and DeepSpec's configs tap five target layers
# knobs of EAGLE-3's record only: a DFlash run refuses a value other than their default
_EAGLE3_ONLY = ("init_from", "train_only", "round_weight", "feature_weight", "norms")


def default_taps(num_layers: int, num_taps: int = DEFAULT_NUM_TAPS) -> tuple[int, ...]:
    """z-lab's default target layers (`build_target_layer_ids`: spread over [1, L-3]) as boundaries."""
    return from_engine(zlab_default_ids(num_layers, num_taps), "zlab", num_layers)


def make_contract(
    target: TargetTensors, taps: tuple[int, ...], vmap: VocabMap | None, c: TrainConfig
) -> WiringContract:
    """A DFlash draft's contract: the taps, the full vocabulary or `vmap`'s, block_size from the knob, and the
    mask token chosen for the target's tokenizer (draft/dflash_contract.py pick_mask_token)."""
    block = BlockWiring(block_size=c.block_size, mask_token_id=pick_mask_token(target.tokenizer))
    return dflash_contract(target, tuple(taps), block, vmap)


def _refuse_eagle3_knobs(c: TrainConfig) -> None:
    defaults = TrainConfig()
    set_ = [k for k in _EAGLE3_ONLY if getattr(c, k) != getattr(defaults, k)]
    if set_:
        raise ContractMismatch(
            "training knobs of EAGLE-3 set for a DFlash draft",
            expected=f"{', '.join(_EAGLE3_ONLY)} at their defaults (EAGLE-3 only)",
            found=", ".join(f"{k}={getattr(c, k)!r}" for k in set_),
            fix="drop them, or train an EAGLE-3 draft (--family eagle3)",
        )


def build_draft(target: TargetTensors, contract: WiringContract, vmap: VocabMap | None, c: TrainConfig) -> DFlashDraft:
    """A fresh DFlash draft of `c.num_layers` layers for the contract's block wiring."""
    _refuse_eagle3_knobs(c)
    if contract.block is None or contract.block.block_size != c.block_size:
        raise ContractMismatch(
            "the training block size is not the contract's",
            expected=f"block_size {c.block_size} (the knob)",
            found=f"contract block {contract.block}",
            fix="build the contract from the knob",
        )
    draft = build_dflash_draft(target, contract, c.num_layers, seed=c.seed, vmap=vmap)
    if c.init_layers_from_target:
        init_from_target(draft, target)
    return draft


def init_from_target(draft: DFlashDraft, target: TargetTensors) -> None:
    """Start the draft where the target already is: draft layer i as target decoder layer s + i, s the layer that
    reads the last tap's boundary (moved down where fewer than num_layers layers follow it); `hidden_norm` as
    layer s's input norm and `fc` passing the last tap through (zero on the others), so at step 0 the context's
    keys and values in layer 0 are target layer s's own. Weights the target lacks (a Llama target's q/k norms)
    keep their init; a shape that differs is refused. Why: from a random start the block's queries see the
    context through near-uniform attention and learn slowly (the experiment log has the side-by-side curve)."""
    n, L, H = draft.cfg.num_layers, target.num_layers, draft.cfg.target_hidden_size
    assert draft.contract is not None, "build_dflash_draft attaches the contract"
    taps = draft.contract.taps
    if draft.cfg.hidden_size != H:
        raise ContractMismatch(
            "cannot start the DFlash draft from the target's layers",
            expected=f"draft hidden size = target's ({H})",
            found=str(draft.cfg.hidden_size),
            fix="drop init_layers_from_target",
        )
    start = min(taps[-1], L - n)
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            copy_target_layer(
                layer, target.layer_parameters(start + i), f"DFlash layer {i} from target layer {start + i}"
            )
        draft.hidden_norm.weight.copy_(target.layer_parameters(start)["input_layernorm.weight"])
        draft.fc.weight.zero_()
        draft.fc.weight[:, (len(taps) - 1) * H :].copy_(torch.eye(H))  # [H, n*H]: the last tap, as is


def block_model(
    draft: DFlashDraft, target: TargetTensors, vmap: VocabMap | None, features: Any, c: TrainConfig, info: DistInfo
) -> BlockModel:
    """The draft and its block loss; the attached target embedding and head follow it to the device."""
    emb, head = draft.embed_weight, draft.head_weight
    assert emb is not None and head is not None, "build_dflash_draft attaches the target's embedding and head"
    draft.attach_target(emb.to(info.device), head.to(info.device))  # .to() is a no-op where they already are
    block = draft.block
    vocab = (draft.d2t, draft.t2d) if draft.reduced else None
    return BlockModel(
        draft,
        head.to(info.device),
        vocab=vocab,
        block_size=block.block_size,
        mask_token_id=block.mask_token_id,
        num_anchors=c.anchors,
        gamma=c.block_gamma,
        loss=c.loss,
        seed=c.seed,
        world_size=info.world_size,
        reduce_count=lambda x: all_reduce_sum(x, info),
    )
