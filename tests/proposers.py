"""Test doubles of the Proposer protocol (eaglewire.decoding.propose): an always-right and a random drafter,
to check that speculative decoding is lossless whatever the drafts are."""

from __future__ import annotations

import torch

from eaglewire.decoding.tree import DraftTree, TreeShape


class OracleProposer:
    """Knows the greedy continuation: proposes the next tokens exactly (every draft accepted). With
    topk > 1 it adds wrong siblings, so tree acceptance walks past decoys."""

    taps: tuple[int, ...] = ()

    def __init__(self, reference: list[int], shape: TreeShape, wrong: int = 0) -> None:
        self.ref, self.shape, self.wrong = reference, shape, wrong

    def start(self, prompt_ids: torch.Tensor, prompt_taps: torch.Tensor | None, first_token: int) -> None:
        self.done = 1  # tokens of the continuation committed or pending

    def accept(self, taps: torch.Tensor | None, tokens: list[int]) -> None:
        self.done += len(tokens)

    def propose(self) -> DraftTree:
        nxt = self.ref[self.done : self.done + self.shape.num_steps] or [self.wrong]
        tokens, parents = [], []
        last = -1  # the previous chain token's index (a root has none)
        for d, tok in enumerate(nxt):
            if self.shape.topk > 1 and len(tokens) + 2 <= self.shape.num_draft_tokens - 1:
                tokens.append((tok + 1) % 50)  # a wrong sibling first
                parents.append(parents[-1] if parents else -1)  # placeholder fixed below
                parents[-1] = -1 if d == 0 else last
            tokens.append(tok)
            parents.append(-1 if d == 0 else last)
            last = len(tokens) - 1
            if len(tokens) >= self.shape.num_draft_tokens - 1:
                break
        return DraftTree(tokens=tokens, parents=parents)


class RandomProposer:
    """Random drafts (almost never accepted)."""

    taps: tuple[int, ...] = ()

    def __init__(self, vocab: int, shape: TreeShape, seed: int = 0) -> None:
        self.vocab, self.shape = vocab, shape
        self.g = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids: torch.Tensor, prompt_taps: torch.Tensor | None, first_token: int) -> None:
        pass

    def accept(self, taps: torch.Tensor | None, tokens: list[int]) -> None:
        pass

    def propose(self) -> DraftTree:
        m = self.shape.num_draft_tokens - 1
        toks = torch.randint(0, self.vocab, (m,), generator=self.g).tolist()
        parents = [-1 if i < self.shape.topk else (i - self.shape.topk) for i in range(m)]
        return DraftTree(tokens=toks, parents=parents)
