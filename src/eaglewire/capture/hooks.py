"""Capture tapped residual-stream states from any HF decoder with forward hooks.

Boundary b (see eaglewire.contract) is read as:
    b = 0     the hidden_states argument entering decoder layer 0   (forward pre-hook on layers[0])
    b = k     the output of decoder layer k-1                        (forward hook on layers[k-1])
so b = L is the last layer's output BEFORE the final norm, which HF's `output_hidden_states` does not
return (its entry L is post-norm). One code path for every architecture: only the decoder-layer list,
located structurally by `find_decoder_stack`, is touched.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from eaglewire.contract import CANONICAL, HOOKED, WiringContract, renumber, validate_boundaries
from eaglewire.errors import ContractMismatch, EaglewireError
from eaglewire.safeio import atomic_save_safetensors, open_safetensors
from eaglewire.target.loader import Target

CAPTURE_FORMAT = "eaglewire.capture/1"


@dataclass
class Captured:
    taps: torch.Tensor  # [B, T, n*H] tapped boundaries concatenated in ascending (contract) order
    final_hidden: torch.Tensor  # [B, T, H] the target's final-norm output (what lm_head reads)
    logits: torch.Tensor | None  # [B, T, V] target logits, if requested


def _first_tensor(x: Any) -> torch.Tensor:
    # Decoder layers return a tensor in transformers 5, a tuple (hidden, ...) in older code.
    return x[0] if isinstance(x, (tuple, list)) else x


@contextmanager
def tap_hooks(target: Target, taps: Sequence[int], store: dict[int | str, list[torch.Tensor]]) -> Iterator[None]:
    """Forward hooks recording boundary b's state into store[b] (and the final norm's) while active:
    capture() and the HF fallback runtime (decoding/hf_runtime.py) read taps through them."""
    handles = []

    def record(key: int | str, tensor: torch.Tensor) -> None:
        store.setdefault(key, []).append(tensor)

    for b in taps:
        if b == 0:

            def pre(_m, args, kwargs, b=b):
                record(b, args[0] if args else kwargs["hidden_states"])

            handles.append(target.layers[0].register_forward_pre_hook(pre, with_kwargs=True))
        else:

            def post(_m, _args, out, b=b):
                record(b, _first_tensor(out))

            layer = renumber((b,), CANONICAL, HOOKED, target.num_layers)[0]  # whose output boundary b is
            handles.append(target.layers[layer].register_forward_hook(post))
    handles.append(target.final_norm.register_forward_hook(lambda _m, _a, out: record("final", out)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] mask -> [B, T] positions counting only real tokens, so left and right padding both give
    each sequence the positions it would have unpadded (pad slots get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_kwargs(
    target: Target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, logits: bool
) -> dict[str, Any]:
    """The exact keyword arguments capture passes to the target (tests reuse them for HF references)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    kw: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "use_cache": False,
    }
    if not logits and "logits_to_keep" in inspect.signature(target.model.forward).parameters:
        kw["logits_to_keep"] = 1  # skip the [B, T, V] head when the caller only wants hidden states
    return kw


@torch.no_grad()
def capture(
    target: Target,
    taps: Sequence[int],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    logits: bool = False,
) -> Captured:
    """Run the target once and return its tapped states.

    input_ids:      [B, T] token ids (padded)
    attention_mask: [B, T] 1 for real tokens, 0 for padding (None = no padding)
    """
    taps = validate_boundaries(taps, target.num_layers)
    dev = target.device  # where the target reads its inputs; the states come back there
    input_ids = input_ids.to(dev)
    attention_mask = attention_mask.to(dev) if attention_mask is not None else None
    store: dict[int | str, list[torch.Tensor]] = {}
    with tap_hooks(target, taps, store):
        out = target.model(**forward_kwargs(target, input_ids, attention_mask, logits=logits))
    for key in (*taps, "final"):
        if len(store.get(key, [])) != 1:
            raise EaglewireError(
                f"hook for tap {key!r} fired {len(store.get(key, []))} times in one forward",
                expected="exactly once (one pass through the decoder stack)",
                found=f"decoder layers at {target.layers_path}",
                fix="this model runs its layers more than once; capture is not supported for it",
            )
    states = [store[b][0].to(dev) for b in taps]  # each [B, T, H]; a spread target's layers sit on several GPUs
    return Captured(
        taps=torch.cat(states, dim=-1),
        final_hidden=store["final"][0].to(dev),
        logits=out.logits.to(dev) if logits else None,
    )


def save_capture(path: Path, captured: Captured, contract: WiringContract, input_ids: torch.Tensor) -> None:
    """Write a capture dump whose metadata carries the wiring contract."""
    # written from the CPU: a dump is a host file, whatever device the target ran on
    tensors = {"taps": captured.taps.cpu(), "final_hidden": captured.final_hidden.cpu(), "input_ids": input_ids.cpu()}
    if captured.logits is not None:
        tensors["logits"] = captured.logits.cpu()
    atomic_save_safetensors(
        tensors, path, metadata={"format": CAPTURE_FORMAT, "contract": contract.to_json(indent=None)}
    )


def load_capture(path: Path, expected: WiringContract | None = None) -> tuple[dict[str, torch.Tensor], WiringContract]:
    """Read a capture dump; with `expected`, refuse one made for another contract."""
    with open_safetensors(path, what="a capture dump", error=ContractMismatch) as f:
        meta = f.metadata()
        if meta.get("format") != CAPTURE_FORMAT or "contract" not in meta:
            raise ContractMismatch(
                f"{path} is not an eaglewire capture dump",
                expected=f"safetensors metadata format={CAPTURE_FORMAT} with a contract",
                found=f"metadata keys {sorted(meta)}",
            )
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    contract = WiringContract.from_json(meta["contract"])
    if expected is not None:
        expected.require_compatible(contract, where=f"capture dump {path}")
    if tensors["taps"].shape[-1] != contract.tap_width:
        raise ContractMismatch(
            f"capture dump {path} is inconsistent with its own contract",
            expected=f"taps width {contract.tap_width}",
            found=str(tuple(tensors["taps"].shape)),
        )
    return tensors, contract
