"""Fallback runtime for architectures the static-cache runtime does not cover (DeepSeek-V3/MLA, MoE, ...):
HF transformers' own forward with a DynamicCache, explicit position ids and a 4-D boolean attention mask,
behind the same interface (runtime.Runtime: forward / greedy / commit). Slower, same results; taps come
from the same forward hooks as training capture.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from eaglewire.capture.hooks import tap_hooks
from eaglewire.target.loader import Target


class HFRuntime:
    def __init__(self, target: Target, max_len: int, batch: int = 1) -> None:
        from transformers import DynamicCache

        self.target, self.max_len = target, max_len
        self.cache = DynamicCache(config=target.model.config)  # type: ignore[arg-type]  # a PreTrainedModel's

    def _length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same contract as StaticRuntime.forward: the cache is cut back to `start` entries first (slots a
        previous tree verify wrote beyond the accepted path are dropped)."""
        B, T = ids.shape
        if start + T > self.max_len:
            raise ValueError(f"KV cache full: {start}+{T} > max_len {self.max_len}")
        if self._length() > start:
            self.cache.crop(start - self._length())  # negative: number of entries to remove
        if mask is None:
            mask = torch.ones(T, start + T, dtype=torch.bool, device=ids.device).tril(start)[None, None]
        store: dict[int | str, list[torch.Tensor]] = {}
        with tap_hooks(self.target, taps, store) if taps else nullcontext():
            out = self.target.model(
                input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=self.cache, use_cache=True
            )
        logits = out.logits if logit_rows is None else out.logits[:, logit_rows.to(out.logits.device)]
        # a target spread over GPUs taps layers on several devices: the taps meet where the inputs are
        tapped = torch.cat([store[b][0].to(ids.device) for b in taps], dim=-1) if taps else None
        return logits, tapped

    def greedy(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        taps: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward's arguments -> (argmax token per row, taps), as StaticRuntime.greedy."""
        logits, tapped = self.forward(ids, positions, start, mask, taps, logit_rows)
        return logits.argmax(-1), tapped

    def commit(self, src: torch.Tensor, dst_start: int) -> None:
        """Move accepted slots into place in every layer's keys and values."""
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is not None and t.numel():  # each layer's cache on its own device (a target spread over GPUs)
                    dst = torch.arange(dst_start, dst_start + src.numel(), device=t.device)
                    t[:, :, dst] = t[:, :, src.to(t.device)]
