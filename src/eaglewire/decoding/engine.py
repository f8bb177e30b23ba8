"""Speculative decoding, greedy, batch 1. The whole algorithm:

    prefill:  target(prompt) -> logits, taps;  x = argmax(last)      (x is "pending": not in the KV cache)
              proposer.start(prompt, taps, x)
    loop:     tree  = proposer.propose()                             M drafted nodes after x
              g     = argmax target([x] + tree) in ONE forward        tree mask; cache slots n .. n+M
              path  = longest root-to-node walk with tree.token == g[parent]
              bonus = g[last node on the path]
              commit x and the path's KV to slots n .. n+a (one gather), n += a + 1
              proposer.accept(taps of x and the path, path tokens + [bonus]);  x = bonus
    stop at EOS (anything after it is dropped) or max_new_tokens.
Greedy rounds ask the runtime for argmax ids only (`rt.greedy`: the exact fp32 argmax, possibly through
the head's bf16 screen), sampling rounds for logits (`rt.forward`). Every emitted token is a target argmax
given the tokens before it, so the output equals plain greedy
decoding token for token whatever the proposer does (tested with always-right and random drafts). In
bf16 that holds up to bf16 rounding only: a verify of k rows does not round like a 1-row decode step
(bf16 SDPA and some bf16 GEMMs are not batch-invariant) and bf16 logits tie exactly at a few % of
positions, where the two may take different, equally greedy, tokens and part (tests/decoding/test_runtime_dtype.py).
With temperature > 0 the walk uses `sample_accept` (rejection sampling against point-mass proposals),
so every emitted token is an exact sample of the target's distribution (statistical test).
tau = mean over verify steps of (accepted drafts + 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from eaglewire.tau import acceptance_length
from eaglewire.decoding.propose import Proposer
from eaglewire.decoding.runtime import Out, Runtime
from eaglewire.decoding.tree import DraftTree, greedy_accept, sample_accept, target_probs


@dataclass
class SpecStats:
    """Acceptance record of one or more generations (concatenate `accepted` to pool several)."""

    verify_steps: int = 0
    accepted: list[int] = field(default_factory=list)  # accepted drafts per verify step
    new_tokens: int = 0
    prefill_s: float = 0.0  # the prompt's forward to its first new token (within total_s)
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    @property
    def tau(self) -> float:
        return acceptance_length(sum(self.accepted), len(self.accepted))

    def per_position(self, depth: int) -> list[float]:
        """Share of verify steps that accepted at least i+1 drafts, i = 0..depth-1."""
        n = max(1, len(self.accepted))
        return [sum(a > i for a in self.accepted) / n for i in range(depth)]


class SpecDecoder:
    def __init__(self, runtime: Runtime, proposer: Proposer) -> None:
        self.rt, self.proposer = runtime, proposer

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        eos: set[int] | None = None,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> tuple[list[int], SpecStats]:
        """prompt [1, P] -> (new tokens, stats). temperature 0 = greedy; else lossless rejection sampling.
        `on_tokens` receives each round's newly committed tokens (streaming)."""
        eos, st, t0 = eos or set(), SpecStats(), time.perf_counter()
        pick = _Pick(temperature <= 0, temperature, top_p, torch.Generator().manual_seed(seed))
        # greedy needs only each row's argmax (rt.greedy: the screened head where calibrated); sampling every logit
        target = self.rt.greedy if pick.greedy else self.rt.forward
        taps, dev = self.proposer.taps, self.rt.target.device  # every tensor made here goes to the target's device
        x, n = self._prefill(target, pick, prompt.to(dev), st, t0)
        out: list[int] = []

        def emit(toks: list[int]) -> None:
            out.extend(toks)
            if on_tokens and toks:
                on_tokens(toks)

        while True:
            emit([x])
            if x in eos or len(out) >= max_new_tokens:
                break
            t = time.perf_counter()
            tree = self.proposer.propose()
            t2 = time.perf_counter()
            ids, pos, mask = tree.verify_inputs(x, n, dev)
            vout, vtaps = target(ids, pos, n, mask, taps=taps)
            path, bonus = pick.walk(tree, vout)
            slots = [n] + [n + 1 + i for i in path]
            if slots != list(range(n, n + len(slots))):
                self.rt.commit(torch.tensor(slots, device=dev), n)  # tree: move the accepted branch into place
            st.verify_steps += 1
            st.accepted.append(len(path))
            accepted = [tree.tokens[i] for i in path]
            t3 = time.perf_counter()
            st.draft_s, st.verify_s = st.draft_s + t2 - t, st.verify_s + t3 - t2
            stop = _stop_index(accepted, eos, max_new_tokens - len(out))
            if stop is not None:
                emit(accepted[: stop + 1])
                break
            emit(accepted)
            rows = torch.tensor([0] + [1 + i for i in path], device=dev)  # the root and the path in the verify batch
            n += len(slots)
            self.proposer.accept(vtaps[:, rows] if vtaps is not None else None, accepted + [bonus])
            x = bonus
            st.draft_s += time.perf_counter() - t3  # the proposer's accept is drafting work too
        st.new_tokens, st.total_s = len(out), time.perf_counter() - t0
        return out, st

    def _prefill(
        self, target: Callable[..., Out], pick: _Pick, prompt: torch.Tensor, st: SpecStats, t0: float
    ) -> tuple[int, int]:
        """The prompt's forward, its first new token x (pending: not in the KV cache) and the proposer's start;
        prompt [1, P] on the target's device -> (x, P: the next free cache slot). Times go into `st`."""
        dev, P = self.rt.target.device, prompt.shape[1]
        out0, prompt_taps = target(
            prompt,
            torch.arange(P, device=dev)[None],
            0,
            taps=self.proposer.taps,
            logit_rows=torch.tensor([P - 1], device=dev),
        )
        x = pick.first(out0)  # an int: the prefill has finished on any device
        st.prefill_s = time.perf_counter() - t0
        t = time.perf_counter()
        self.proposer.start(prompt, prompt_taps, x)
        st.draft_s += time.perf_counter() - t
        return x, P


@dataclass
class _Pick:
    """How the target's output becomes tokens: greedy reads argmax ids, sampling draws from the logits
    (lossless rejection sampling for the drafted tree)."""

    greedy: bool
    temperature: float
    top_p: float
    gen: torch.Generator

    def first(self, out: torch.Tensor) -> int:
        """The prefill's next token; out: argmax ids [1, 1] or logits [1, 1, V] (its last row)."""
        if self.greedy:
            return int(out[0, -1])
        # sampled on the CPU with a CPU generator: the same seed draws the same tokens on any device
        probs = target_probs(out[0, -1], self.temperature, self.top_p).cpu()  # [V]
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def walk(self, tree: DraftTree, vout: torch.Tensor) -> tuple[list[int], int]:
        """vout: argmax ids [1, M+1] or logits [1, M+1, V] of a verify -> (accepted path, bonus token)."""
        if self.greedy:
            return greedy_accept(tree, vout[0].tolist())
        return sample_accept(tree, target_probs(vout[0], self.temperature, self.top_p).cpu(), self.gen)


def _stop_index(tokens: list[int], eos: set[int], room: int) -> int | None:
    """Index of the last token to emit if EOS or the token budget falls inside `tokens`, else None."""
    for i, tok in enumerate(tokens):
        if tok in eos or i + 1 >= room:
            return i
    return None


@torch.no_grad()
def greedy_reference(
    runtime: Runtime, prompt: torch.Tensor, max_new_tokens: int, eos: set[int] | None = None
) -> list[int]:
    """Plain greedy decoding on the same runtime (one token per forward): the lossless reference."""
    eos, P, dev = eos or set(), prompt.shape[1], runtime.target.device
    tok, _ = runtime.greedy(
        prompt.to(dev), torch.arange(P, device=dev)[None], 0, logit_rows=torch.tensor([P - 1], device=dev)
    )
    out = [int(tok[0, -1])]
    while out[-1] not in eos and len(out) < max_new_tokens:
        n = P + len(out) - 1
        tok, _ = runtime.greedy(torch.tensor([[out[-1]]], device=dev), torch.tensor([[n]], device=dev), n)
        out.append(int(tok[0, -1]))
    return out
