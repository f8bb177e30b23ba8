"""Wiring probe: which residual-stream boundaries did an engine actually deliver to the draft?

Input: a dump of the hidden states the draft received for a known prompt (`hidden` [T, W] or [1, T, W]
and `input_ids` [T]). The target is run on the same tokens, every boundary 0..L (and the post-norm
state HF calls hidden_states[L]) is captured, and each H-wide chunk of the dump is matched to the
boundary it equals (relative error < `tol`, loose enough for bf16 engines).

How to write a dump from an engine (env-var guarded, a few lines in the draft's forward):

SGLang, python/sglang/srt/models/llama_eagle3.py, LlamaModel.forward, before the fc check:
    import os
    if os.environ.get("EAGLEWIRE_DUMP") and hidden_states.shape[0] > 1:
        from safetensors.torch import save_file
        save_file({"hidden": hidden_states.float().cpu().contiguous(),
                   "input_ids": forward_batch.input_ids.cpu().contiguous()}, os.environ["EAGLEWIRE_DUMP"])
vLLM, vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM.combine_hidden_states, first line:
    import os
    if os.environ.get("EAGLEWIRE_DUMP"):
        from safetensors.torch import save_file
        save_file({"hidden": hidden_states.float().cpu().contiguous()}, os.environ["EAGLEWIRE_DUMP"])
    (vLLM's draft does not see the token ids there: pass --ids "1,2,3" or add input_ids from the proposer.)
Send one prompt (e.g. "Hello") with the env var set, then run
    eaglewire doctor probe --dump FILE --target T --contract DRAFT_DIR/eaglewire_contract.json
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.contract import WiringContract
from eaglewire.errors import EaglewireError
from eaglewire.safeio import open_safetensors
from eaglewire.capture.hooks import capture
from eaglewire.target.loader import Target

POST_NORM = "post-norm"


@dataclass
class ProbeResult:
    received: list[int | str | None]  # per chunk: boundary, "post-norm", or None (unrecognised)
    trained: list[int]
    width: int
    hidden_size: int
    ok: bool
    message: str


def _load_dump(path: Path, ids: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    with open_safetensors(path, what="a hidden-state dump") as f:
        keys = set(f.keys())
        if "hidden" not in keys:
            raise EaglewireError(
                f"{path} has no 'hidden' tensor", expected="hidden [T, W] and input_ids [T]", found=str(sorted(keys))
            )
        hidden = f.get_tensor("hidden").float()
        token_ids = f.get_tensor("input_ids").long().flatten() if "input_ids" in keys else None
    if ids is not None:
        token_ids = torch.tensor(ids)
    if token_ids is None:
        raise EaglewireError(f"{path} has no input_ids", expected="input_ids in the dump, or --ids", found="neither")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    if hidden.shape[0] != token_ids.numel():
        raise EaglewireError(
            "dump has a different number of positions than token ids",
            expected=f"{token_ids.numel()} rows",
            found=f"{hidden.shape[0]} rows",
        )
    return hidden, token_ids


def identify(
    target: Target, hidden: torch.Tensor, token_ids: torch.Tensor, tol: float = 2e-2
) -> list[int | str | None]:
    """Match each H-wide chunk of hidden [T, W] to a boundary of the target on the same tokens."""
    L, H = target.num_layers, target.hidden_size
    cap = capture(target, tuple(range(L + 1)), token_ids[None])
    states = list(cap.taps[0].split(H, dim=-1)) + [cap.final_hidden[0]]  # boundaries 0..L, then post-norm
    names: list[int | str] = list(range(L + 1)) + [POST_NORM]
    out: list[int | str | None] = []
    for chunk in hidden.split(H, dim=-1):
        errs = torch.stack([(chunk - s).norm() / s.norm().clamp_min(1e-6) for s in states])
        best = int(errs.argmin())
        out.append(names[best] if float(errs[best]) < tol else None)
    return out


def probe(target: Target, dump: Path, contract: WiringContract, ids: list[int] | None = None) -> ProbeResult:
    hidden, token_ids = _load_dump(dump, ids)
    H, W, trained = target.hidden_size, hidden.shape[-1], list(contract.taps)
    if W % H:
        return ProbeResult(
            [],
            trained,
            W,
            H,
            False,
            f"the draft received {W}-wide states, not a multiple of the "
            f"target hidden size {H}: this is not a concatenation of target layers",
        )
    received = identify(target, hidden, token_ids)
    if received == trained:
        return ProbeResult(received, trained, W, H, True, f"the draft received boundaries {trained}, as trained")
    if len(received) == 1 and len(trained) > 1:
        msg = (
            f"the draft received ONE {W}-wide state ({boundary_label(received[0])}) instead of {len(trained)} taps "
            f"({len(trained) * H} wide): aux hidden-state capture is off (use_aux_hidden_state / layer ids not "
            "applied); EAGLE/SGLang then skip fc silently because the width equals the draft hidden size"
        )
    else:
        names = "[" + ", ".join(boundary_label(r) for r in received) + "]"
        msg = f"the draft received boundaries {names}; it was trained on {trained}" + (
            " (same layers, other order)" if sorted(map(str, received)) == sorted(map(str, trained)) else ""
        )
    return ProbeResult(received, trained, W, H, False, msg)


def boundary_label(r: int | str | None) -> str:
    """How reports name an identified chunk: a boundary, "0 (embedding)", "post-norm" or "unrecognised"."""
    if r is None:
        return "unrecognised"
    if r == 0:
        return "0 (embedding)"
    return str(r)
