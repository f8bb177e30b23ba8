"""How a draft starts and what of it trains: from the target's top layers, from another draft (a warm start,
which may grow the vocabulary or the depth), and which weights a run leaves frozen.

Training adds up across runs through `warm_start` (the released draft is the next run's start);
a grown vocabulary's new head rows start mapped from the target's (`mapped_head_rows`) and can be trained
alone (`freeze`), leaving every weight the warm start had exactly as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError
from eaglewire.norms import norm_preset_name
from eaglewire.draft.vocab import VocabMap
from eaglewire.target.protocol import TargetTensors


def copy_target_layer(
    layer: torch.nn.Module,
    src: dict[str, torch.Tensor],
    what: str,
    place: Callable[[str, torch.Tensor, torch.Tensor], bool] | None = None,
) -> None:
    """Start a draft layer from a target layer: each parameter the target layer holds by the same name (`src`,
    target.layer_parameters) is copied; the others (the draft's own norms) keep their init. `place(name, p, w)`
    may write a weight of another shape itself and return True; any other shape mismatch is refused, naming
    `what` ("draft layer 0 from target layer 29"). Call under torch.no_grad()."""
    for name, p in layer.named_parameters():
        if name not in src:
            continue
        w = src[name]
        if place is not None and place(name, p, w):
            continue
        if tuple(p.shape) != tuple(w.shape):
            raise CheckpointError(
                f"cannot start {what}",
                expected=f"{name} of shape {tuple(p.shape)}",
                found=str(tuple(w.shape)),
                fix="drop init_layers_from_target for this target",
            )
        p.copy_(w)


def init_layers_from_target(draft: Eagle3Draft, target: TargetTensors) -> None:
    """Start draft layer i from target decoder layer L - n + i (the top of the stack, whose input is closest
    to the fused state the draft reads). Layer 0's q/k/v read [embed ; hidden] (2H wide): the hidden half
    takes the target's projection, the embedding half keeps its random init. Refused where shapes differ."""
    n, L, H = draft.cfg.num_layers, target.num_layers, draft.cfg.hidden_size

    def hidden_half(name: str, p: torch.Tensor, w: torch.Tensor) -> bool:
        if name.split(".")[-2] not in ("q_proj", "k_proj", "v_proj"):
            return False
        p[:, H:].copy_(w)  # [out, 2H]: columns H: read hidden_norm(hidden)
        return True

    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            copy_target_layer(
                layer,
                target.layer_parameters(L - n + i),
                f"draft layer {i} from target layer {L - n + i}",
                hidden_half if layer.first else None,
            )


GROWN_OUT_SCALE = 0.01  # an added layer's output projections start at this fraction of their random init


def mapped_head_rows(target_rows: torch.Tensor, kept: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Head rows for the ids a grown vocabulary adds: the target's own head rows carried into the trained
    draft's head space by the affine map that best carries them there on the ids both keep.

    target_rows [V_d, H] the target's head rows for every id of the new vocab; kept [V_d] bool the ids the
    source draft had; trained [n_kept, H] its trained rows for them, in the same order. Returns [V_d - n_kept,
    H] for the others. Why: a trained draft head is close to a linear image of the target's (the draft learns
    to reproduce the target's logits from a state that is close to a linear image of the target's final state;
    the released draft's 8,000 rows: R^2 0.93, 0.92 on rows left out of the fit), so a new token's row starts
    where training would move it, and the grown draft can name the token where the target would. Least squares
    (min-norm when fewer rows than H + 1 are kept)."""
    x = _with_ones(target_rows)  # [V_d, H+1]
    return x[~kept] @ head_affine(target_rows[kept], trained)


def head_affine(target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """[H+1, H] the least-squares affine map carrying the target's head rows to a draft's, row for row
    (draft row ~= [target row, 1] @ map; min-norm when fewer rows than H + 1)."""
    return torch.linalg.lstsq(_with_ones(target_rows), draft_rows.float(), driver="gelsd").solution


def _with_ones(rows: torch.Tensor) -> torch.Tensor:
    return torch.cat([rows.float(), rows.new_ones(len(rows), 1, dtype=torch.float32)], 1)  # [N, H+1]


def warm_start(
    draft: Eagle3Draft, path: Path, target: TargetTensors, vmap: VocabMap, taps: tuple[int, ...]
) -> torch.Tensor:
    """Copy a trained draft's weights into `draft` (a run continues an earlier one's training); returns
    [V_d] bool, the head rows of ids new to this vocab (what `freeze` may train alone).

    Everything but the head is copied as is; the taps and layer shapes must match (refused otherwise:
    a draft trained on other boundaries is no warm start). The head is remapped by target id: rows of
    ids both vocabularies keep are copied; a row of an id new to this vocab starts as the target's head row
    for that id mapped into the draft's head space (`mapped_head_rows`). The target's rows as they are
    (what a fresh draft starts from) outscore the trained ones, so a new token would win everywhere and
    acceptance collapses; mapped rows neither win nor lose against the trained ones (docs/results/experiments.md has
    the levers tried).
    A deeper `draft` grows: the source's layers are copied and each added layer's two output projections
    (o_proj, down_proj) start at GROWN_OUT_SCALE of their random init, so the grown draft predicts what
    the source did (to ~1e-3) and every weight of the new layer learns from step 1. Not exactly zero: Adam normalises
    the gradient, so a layer whose output projections are zero
    gives its q/k/v and MLP inputs a zero update until those projections move (such a layer's training then
    matches the shallower control's).
    The optimizer state and the lr schedule start afresh."""
    from eaglewire.export.checkpoint import load_checkpoint

    src = load_checkpoint(path, target=target)
    _refuse_other_wiring(src, draft, path, taps)
    mine, theirs = draft.state_dict(), src.state_dict()
    added = range(src.cfg.num_layers, draft.cfg.num_layers)  # empty unless the draft grows
    skip = {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"} | {k for k in mine if _layer_of(k) in added}
    bad = sorted(k for k in mine if k not in skip and (k not in theirs or theirs[k].shape != mine[k].shape))
    _refuse_other_shape(src, draft, path, bad)
    with torch.no_grad():
        for k in mine:
            if k not in skip:
                mine[k].copy_(theirs[k].to(mine[k].dtype))
        for i in added:  # near-zero output projections: the added layer starts near the identity
            draft.layers[i].self_attn.o_proj.weight.mul_(GROWN_OUT_SCALE)
            draft.layers[i].mlp.down_proj.weight.mul_(GROWN_OUT_SCALE)
        return _remap_head(draft, src, vmap, theirs["lm_head.weight"])


def _refuse_other_wiring(src: Any, draft: Eagle3Draft, path: Path, taps: tuple[int, ...]) -> None:
    """A warm start reads the same target boundaries with the same norm flags, or it is no warm start."""
    if tuple(src.contract.taps) != taps:
        raise CheckpointError(
            f"cannot warm-start from {path}: it reads other target boundaries",
            expected=f"taps {list(taps)}",
            found=f"taps {list(src.contract.taps)}",
            fix="train with the warm-start draft's taps, or drop init_from",
        )
    if src.cfg.norm != draft.cfg.norm:
        theirs_name = norm_preset_name(src.cfg.norm)
        raise CheckpointError(
            f"cannot warm-start from {path}: it was trained with other norm flags",
            expected=f"{draft.cfg.norm}",
            found=f"{src.cfg.norm}",
            fix=f"train with --norms {theirs_name or 'auto'} (the warm-start draft's own), or drop init_from",
        )


def _refuse_other_shape(src: Any, draft: Eagle3Draft, path: Path, bad: list[str]) -> None:
    """`bad`: the weights to copy that the source lacks or holds in another shape; a source deeper than the
    draft, or with another tap count, is refused too (a draft only grows)."""
    if bad or src.cfg.num_layers > draft.cfg.num_layers or src.cfg.num_taps != draft.cfg.num_taps:
        raise CheckpointError(
            f"cannot warm-start from {path}",
            expected=f"a draft of the same shape ({draft.cfg.num_layers} layer(s), {draft.cfg.num_taps} taps)",
            found=f"{src.cfg.num_layers} layer(s), {src.cfg.num_taps} taps; differing: {bad[:5]}",
            fix="drop init_from, or train with the warm-start draft's shape",
        )


def _remap_head(draft: Eagle3Draft, src: Any, vmap: VocabMap, trained: torch.Tensor) -> torch.Tensor:
    """The head rows by target id: the source's `trained` rows [V_src, H] copied for the ids both vocabularies
    keep, the others mapped from the target's rows (`mapped_head_rows`); returns [V_d] bool, the ids new to this
    vocab. Call under torch.no_grad()."""
    old_rows = {int(t): i for i, t in enumerate(src.to_target_ids(torch.arange(src.cfg.draft_vocab_size)))}
    kept = [(i, old_rows[int(t)]) for i, t in enumerate(vmap.target_ids) if int(t) in old_rows]
    head = draft.lm_head.weight  # [V_d, H]: the target's rows (build_draft) until copied over
    fresh = torch.ones(len(head), dtype=torch.bool)  # ids new to this vocab
    if kept:
        new_idx, old_idx = map(torch.tensor, zip(*kept))
        fresh[new_idx] = False
        if fresh.any():
            head[fresh] = mapped_head_rows(head, ~fresh, trained[old_idx]).to(head.dtype)
        head[new_idx] = trained[old_idx].to(head.dtype)
    return fresh


def _layer_of(key: str) -> int | None:
    """The decoder layer a state-dict key belongs to ('layers.3.mlp...' -> 3), None for the rest."""
    parts = key.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else None


# TrainConfig.train_only: every weight, the head, rows new to init_from, everything but the head
TRAIN_ONLY = ("", "head", "new_head_rows", "body")


def freeze(draft: Eagle3Draft, train_only: str, new_rows: torch.Tensor | None, weight_decay: float = 0.0) -> None:
    """Apply `train_only` (TrainConfig's) to a built draft. `new_rows` [V_d] bool: the head rows a warm start
    added (`warm_start`'s result; None without one). A frozen body makes a step the draft's forward plus the
    head's backward. New rows only: the kept rows' gradient is zeroed by a hook, so AdamW (weight decay 0)
    never moves them."""
    if train_only not in TRAIN_ONLY:
        raise ValueError(f"train_only must be one of {TRAIN_ONLY}, not {train_only!r}")
    if not train_only:
        return
    if train_only == "body":  # the head stays as it starts: a fresh draft's is the target's rows for V_d
        draft.lm_head.weight.requires_grad_(False)
        return
    for name, p in draft.named_parameters():
        p.requires_grad_(name == "lm_head.weight")
    if train_only == "head":
        return
    if new_rows is None or weight_decay:
        raise ValueError("train_only='new_head_rows' needs init_from (whose head rows stay) and weight_decay 0")
    if not new_rows.any():
        raise ValueError(
            "train_only='new_head_rows': the vocab adds no id to init_from; grow it "
            "(vocab build --keep-from INIT --draft-vocab-size N, N above the init's)"
        )
    draft.lm_head.weight.register_hook(lambda g: g * new_rows.to(g.device, g.dtype)[:, None])
