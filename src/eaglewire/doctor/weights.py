"""What the weights show without running anything: non-finite values, parts that look never trained.

Read tensor by tensor (a draft is small next to its target). A NaN or Inf anywhere poisons every draft
token (the engine loads it without a word); a norm of zeros erases its input; an lm_head equal to the
target's own rows is a head that was copied, not trained (EAGLE-3 trains its reduced-vocab head).
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors import safe_open

from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.formats.base import WEIGHTS


def weight_findings(ins: Inspection, target: Any) -> list[Finding]:
    path = ins.directory / WEIGHTS
    if not path.is_file():
        return []
    out: list[Finding] = []
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if not t.is_floating_point():
                continue
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                out.append(Finding("error", "weights", f"{k} holds {bad} NaN/Inf value(s)",
                                   "the engine loads them silently: every drafted token is garbage",
                                   "re-export from a healthy checkpoint (training diverged or the file is damaged)"))
            elif k.endswith("norm.weight") and not bool(t.abs().gt(0).any()):
                out.append(Finding("error", "weights", f"{k} is all zeros", "the norm erases its input: the "
                                   "draft sees nothing there", "re-export; the weight was never trained or set"))
            elif k == "lm_head.weight" and target is not None and _copied_head(t, ins, target):
                out.append(Finding("warn", "weights", "lm_head equals the target's lm_head rows bit for bit",
                                   "a copied head, not a trained one: acceptance is that of the target's head on "
                                   "the draft's state", "train the draft head (eaglewire train)"))
    return out


def _copied_head(head: torch.Tensor, ins: Inspection, target: Any) -> bool:
    d2t = ins.small.get("d2t")
    ref = target.model.get_output_embeddings().weight.detach()  # [V, H]
    if d2t is None or d2t.numel() != head.shape[0] or ref.shape[1] != head.shape[1]:
        return False
    ids = torch.arange(d2t.numel()) + d2t.long()  # [V_d] target ids (out of range: the d2t check's finding)
    if int(ids.min()) < 0 or int(ids.max()) >= ref.shape[0]:
        return False
    rows = ref[ids].to(head.dtype)  # [V_d, H]
    return bool(torch.equal(rows, head))
