"""The vocabulary checks: a draft's reduced vocabulary as an engine reads it (draft_vocab_size, the lm_head's rows,
the d2t offsets that map a draft id to a target id, the t2d mask of target ids in the draft vocabulary). Shared by
every family with a head of its own (EAGLE-3 here, block drafters in block_checks.py, GGUF in gguf_checks.py).
"""

from __future__ import annotations

from typing import Any

import torch

from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.target.protocol import TargetInfo


def vocab_map(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    V = target.vocab_size if target is not None else ins.layer_config.get("vocab_size")
    return vocab_map_findings(
        V,
        ins.config.get("draft_vocab_size"),
        ins.shapes.get("lm_head.weight"),
        ins.small.get("d2t"),
        ins.small.get("t2d"),
    )


def vocab_map_findings(
    V: int | None, vd: Any, head: tuple[int, ...] | None, d2t: torch.Tensor | None, t2d: torch.Tensor | None
) -> list[Finding]:
    """A draft's vocabulary as an engine reads it, for any family with a head of its own: the target's vocab
    size V, the config's draft_vocab_size vd, the lm_head's shape, the d2t offsets and the t2d mask."""
    out = _size_findings(V, vd, head)
    if d2t is None:
        if vd is not None and V is not None and vd < V:
            out.append(
                Finding(
                    "error",
                    "d2t",
                    "d2t is missing for a reduced draft vocabulary",
                    "vLLM then maps draft id i to target id i (zeros), SGLang fails: every drafted token is wrong",
                    "export the vocab map (eaglewire export writes d2t and t2d)",
                )
            )
        return out
    if d2t.dtype not in (torch.int64, torch.int32) or d2t.dim() != 1 or not d2t.numel():
        return out  # not a map of offsets at all: dtype_and_contract names its dtype, key shapes its shape
    ids = torch.arange(d2t.numel()) + d2t  # [V_d] the target id of each draft id
    out += _offset_findings(V, d2t, ids)
    if t2d is not None and t2d.dim() == 1:
        out += _mask_findings(V, vd, t2d, ids)
    return out


def _size_findings(V: int | None, vd: Any, head: tuple[int, ...] | None) -> list[Finding]:
    """draft_vocab_size against the target's vocabulary and the lm_head's rows."""
    out = []
    if vd is not None and V is not None and vd > V:
        out.append(
            Finding(
                "error",
                "draft_vocab_size",
                f"draft_vocab_size {vd} > target vocab {V}",
                "the draft can name tokens the target does not have",
                "rebuild the vocab map",
            )
        )
    if vd is None and head is not None and V is not None and head[0] != V:
        out.append(
            Finding(
                "error",
                "draft_vocab_size",
                f"draft_vocab_size is missing but lm_head has {head[0]} of the target's {V} rows",
                "the engine then sizes the draft's vocabulary as the target's: vLLM "
                "refuses the file (no draft_id_to_target_id parameter), others misread the head",
                f"write draft_vocab_size: {head[0]} (eaglewire export does)",
            )
        )
    if head is not None and vd is not None and head[0] != vd:
        out.append(
            Finding(
                "error",
                "draft_vocab_size",
                f"lm_head has {head[0]} rows but draft_vocab_size is {vd}",
                "the engine sizes its head from the config: loading fails or rows are misread",
                "re-export",
            )
        )
    return out


def _offset_findings(V: int | None, d2t: torch.Tensor, ids: torch.Tensor) -> list[Finding]:
    """The d2t offsets: every mapped id inside the target vocabulary, in ascending order."""
    if V is not None and (int(ids.max()) >= V or int(ids.min()) < 0):
        absolute = int(d2t.max()) < V and bool((d2t[1:] > d2t[:-1]).all())
        return [
            Finding(
                "error",
                "d2t",
                "d2t maps draft ids outside the target vocabulary"
                + (" — it holds ABSOLUTE target ids, not offsets" if absolute else ""),
                "engines compute target = i + d2t[i]",
                "store offsets: d2t[i] = target_id[i] - i",
            )
        ]
    if not bool((ids[1:] > ids[:-1]).all()):
        return [
            Finding(
                "warn",
                "d2t",
                "draft ids are not in ascending target-id order",
                "trainers that slice target logits with t2d assume ascending order; the rows would not align",
                "rebuild the vocab map sorted by target id",
            )
        ]
    return []


def _mask_findings(V: int | None, vd: Any, t2d: torch.Tensor, ids: torch.Tensor) -> list[Finding]:
    """The t2d mask: as many target ids as the draft vocabulary, the same ones d2t maps to."""
    if vd is not None and int(t2d.sum()) != vd:
        return [
            Finding(
                "error",
                "t2d",
                f"t2d.sum() = {int(t2d.sum())} but draft_vocab_size = {vd}",
                "the map does not describe this draft's vocabulary",
                "rebuild the vocab map",
            )
        ]
    if V is not None and t2d.numel() == V and int(ids.max()) < V and not bool(t2d[ids].all()):
        return [
            Finding(
                "error",
                "t2d",
                "d2t and t2d disagree on which target ids are in the draft vocab",
                "one of them belongs to another vocab map",
                "rebuild the vocab map",
            )
        ]
    return []
