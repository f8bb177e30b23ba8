"""EAGLE-3's training record: its contract (the taps, a reduced vocabulary, the norm flags), its draft (random,
or warm-started from another), the TTT objective (train/ttt.py); train/objectives.py keys it by family name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eaglewire.contract import WiringContract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.model import Eagle3Draft
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import ContractMismatch
from eaglewire.train.config import TrainConfig, draft_norms
from eaglewire.train.dist import DistInfo, all_reduce_sum
from eaglewire.train.ttt import TTTModel
from eaglewire.train.warm import freeze, head_affine, init_layers_from_target, warm_start
from eaglewire.target.protocol import TargetTensors


def make_contract(
    target: TargetTensors, taps: tuple[int, ...], vmap: VocabMap | None, c: TrainConfig
) -> WiringContract:
    """An EAGLE-3 draft's contract: the taps, its reduced vocabulary and its norm flags (`draft_norms`)."""
    if vmap is None:
        raise ContractMismatch(
            "an EAGLE-3 draft needs a vocab map",
            expected="--vocab (from `eaglewire vocab build`)",
            found="none",
            fix="build one with `eaglewire vocab build` and pass --vocab",
        )
    return target.contract(tuple(taps), vocab_map=vmap, norm=draft_norms(c))


def build_draft(target: TargetTensors, contract: WiringContract, vmap: VocabMap, c: TrainConfig) -> Eagle3Draft:
    """Random draft; lm_head rows and final norm start from the target's (for the kept ids): the
    draft then begins by predicting what the target's head would from a similar state, which matters
    when CPU data is scarce. With `init_from`, the weights then come from that draft (warm start); with
    `train_only`, what does not train is frozen (`warm.freeze`)."""
    draft = Eagle3Draft(DraftConfig.from_target(target.text_config, contract, num_layers=c.num_layers)).init_random(
        c.seed
    )
    with torch.no_grad():
        draft.d2t.copy_(vmap.d2t)
        draft.t2d.copy_(vmap.t2d)
        draft.lm_head.weight.copy_(target.head_rows(vmap.target_ids))  # [V_d, H]
        norm_w = target.final_norm_weight()
        if norm_w is not None and norm_w.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(norm_w)
    draft.attach_embedding(target.embedding())
    if c.init_layers_from_target:
        init_layers_from_target(draft, target)
    new_rows = warm_start(draft, Path(c.init_from), target, vmap, tuple(contract.taps)) if c.init_from else None
    freeze(draft, c.train_only, new_rows, c.weight_decay)
    return draft


def ttt_model(
    draft: Eagle3Draft, target: TargetTensors, vmap: VocabMap, features: Any, c: TrainConfig, info: DistInfo
) -> TTTModel:
    """The draft and its TTT loss. Shards that store the target's top-1 need only the draft vocab's head rows
    ([V_d, H]); the full [V, H] head (its argmax) only for shards captured before top-1 was stored, and online."""
    full = not getattr(features, "stores_target_top1", False)
    head = target.head_rows(None if full else vmap.target_ids).detach().to(info.device)
    return TTTModel(
        draft,
        head if full else None,
        draft_head=None if full else head,
        steps=c.ttt_steps,
        decay=c.ttt_decay,
        loss=c.loss,
        world_size=info.world_size,
        reduce_count=lambda x: all_reduce_sum(x, info),
        round_weight=c.round_weight,
        feature_weight=c.feature_weight,
        feature_space=feature_space(draft, target, vmap, info.device) if c.feature_weight > 0 else None,
    )


@torch.no_grad()
def feature_space(
    draft: Eagle3Draft, target: TargetTensors, vmap: VocabMap, device: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, A) for the feature loss (train.ttt): G [H, H] the Gram matrix of the centred full target head over V
    (s^T G s is the mean squared centred logit of state s), and A [H, H] the least-squares linear part of the
    affine map from the target's head rows to the draft's on the draft vocab (draft row = target row @ A + c,
    so the draft's logit of a state s is the target's logit of A s, up to a per-state constant). Fitted once,
    at the start: a fresh draft's head is the target's rows (A = I); a warm start's has moved away from the
    target's rows, so its states must be compared through A, not raw."""
    full = target.head_rows(None).detach().float()  # [V, H]
    centred = full - full.mean(0, keepdim=True)
    gram = centred.T @ centred / len(full)  # [H, H]
    amap = head_affine(full[vmap.target_ids], draft.lm_head.weight.detach())[:-1]  # [H, H]: the linear part
    return gram.to(device), amap.to(device)
