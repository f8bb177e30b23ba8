"""Fallback runtime for architectures the lean runtime does not cover (DeepSeek-V3/MLA, MoE, ...): HF
transformers' own forward with a DynamicCache, explicit position ids and a 4-D boolean attention mask,
behind the same interface as `LeanTarget` (forward / commit). Slower, same results; taps come from the
same forward hooks as training capture.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable

import torch

from eaglewire.verifier.capture import tap_hooks
from eaglewire.verifier.loader import Target


class HFRuntime:
    def __init__(self, target: Target, max_len: int, batch: int = 1) -> None:
        from transformers import DynamicCache

        self.target, self.max_len = target, max_len
        self.cache = DynamicCache(config=target.model.config)

    def _length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
                taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None):
        """Same contract as LeanTarget.forward: the cache is cut back to `start` entries first (slots a
        previous tree verify wrote beyond the accepted path are dropped)."""
        B, T = ids.shape
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start}+{T} > max_len {self.max_len}")
        if self._length() > start:
            self.cache.crop(start - self._length())  # negative: number of entries to remove
        if mask is None:
            mask = torch.ones(T, start + T, dtype=torch.bool, device=ids.device).tril(start)[None, None]
        store: dict = {}
        with tap_hooks(self.target, taps, store) if taps else nullcontext():
            out = self.target.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                                    past_key_values=self.cache, use_cache=True)
        logits = out.logits if logit_rows is None else out.logits[:, logit_rows]
        tapped = torch.cat([store[b][0] for b in taps], dim=-1) if taps else None
        return logits, tapped

    def greedy(self, ids: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None = None,
               taps: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward's arguments -> (argmax token per row, taps), as LeanTarget.greedy."""
        logits, tapped = self.forward(ids, positions, start, mask, taps, logit_rows)
        return logits.argmax(-1), tapped

    def commit(self, src: torch.Tensor, dst_start: int) -> None:
        """Move accepted slots into place in every layer's keys and values."""
        dst = torch.arange(dst_start, dst_start + src.numel())
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is not None and t.numel():
                    t[:, :, dst] = t[:, :, src]


def make_runtime(target: Target, max_len: int, *, calibrate: bool = False, log: Callable[[str], None] | None = None):
    """The lean runtime where it applies, else the HF fallback. calibrate: set the lean runtime's GEMM
    layouts from this machine's cached calibration, measuring it (seconds) the first time
    (decoding/calibration.py); `log` hears what the start does."""
    from eaglewire.decoding.calibration import calibrate_cached
    from eaglewire.decoding.compiled_body import GRAPH
    from eaglewire.decoding.runtime import CALIBRATION_KS, CALIBRATION_PREFIX, SUPPORTED, LeanTarget

    if target.text_config.model_type not in SUPPORTED:
        if log and calibrate:
            log(f"model_type {target.text_config.model_type!r}: HF transformers' forward (the fallback runtime), "
                "no GEMM layouts to calibrate")
        return HFRuntime(target, max_len)
    # a calibration times verifies of up to max(CALIBRATION_KS) rows after a prefix: room for them even
    # where the requests need less (a short `generate`); the extra slots are a few KB per token
    rt = LeanTarget(target, max(max_len, CALIBRATION_PREFIX + max(CALIBRATION_KS)) if calibrate else max_len)
    if calibrate:
        calibrate_cached(rt, log)
        if GRAPH in rt.policy.values():
            if log:
                log("compiling the target's layer-stack graphs (the calibration chose them: decoding/compiled_body.py;"
                    " about a minute the first time a machine sees this cache size, ~12 s once inductor has cached them)")
            t0 = time.perf_counter()
            rows = rt.compile_graphs()
            if log:
                log(f"graphs for {' and '.join(f'{k}+' if k > 1 else '1' for k in rows)} rows ready in "
                    f"{time.perf_counter() - t0:.1f} s")
    return rt
