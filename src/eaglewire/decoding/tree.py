"""Draft trees: their shape knobs (SGLang's and vLLM's spelling), verification masks, greedy acceptance.

SGLang:  --speculative-num-steps S  --speculative-eagle-topk K  --speculative-num-draft-tokens N
         N counts the ROOT (the last accepted token, verified with the drafts): N-1 drafted nodes.
vLLM:    num_speculative_tokens k  ==  a chain: S = k, K = 1, N = k + 1.
A tree of S levels with top-K expansion can hold at most K + (S-1)*K*K drafted nodes, and needs at
least S of them to reach depth S.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.errors import EaglewireError


@dataclass(frozen=True)
class TreeShape:
    """A round's draft tree: depth S, branching K, N verified tokens (the root included); `chain(k)` for vLLM's k."""

    num_steps: int = 4  # S: draft depth (draft forwards per round)
    topk: int = 1  # K: branching per node (1 = chain)
    num_draft_tokens: int = 5  # N: verified tokens per round INCLUDING the root (SGLang's meaning)

    def __post_init__(self) -> None:
        S, K, N = self.num_steps, self.topk, self.num_draft_tokens
        capacity = K + (S - 1) * K * K
        if S < 1 or K < 1 or N < 2:
            raise EaglewireError(
                "invalid tree shape",
                expected="num_steps >= 1, topk >= 1, num_draft_tokens >= 2",
                found=f"num_steps={S}, topk={K}, num_draft_tokens={N}",
            )
        if N - 1 > capacity:
            raise EaglewireError(
                "more draft tokens than the tree can hold",
                expected=f"num_draft_tokens - 1 <= topk + (num_steps-1)*topk^2 = {capacity}",
                found=f"num_draft_tokens={N} (N counts the root, as in SGLang)",
                fix=f"lower --num-draft-tokens to <= {capacity + 1} or raise --num-steps/--topk",
            )
        if K == 1 and N - 1 != S:
            raise EaglewireError(
                "a chain (topk=1) verifies exactly num_steps drafted tokens",
                expected=f"num_draft_tokens = num_steps + 1 = {S + 1}",
                found=f"num_draft_tokens={N}",
                fix="use --num-speculative-tokens k for a chain",
            )

    @classmethod
    def chain(cls, num_speculative_tokens: int) -> "TreeShape":
        """vLLM's `num_speculative_tokens` = k: a chain of k drafted tokens."""
        return cls(num_steps=num_speculative_tokens, topk=1, num_draft_tokens=num_speculative_tokens + 1)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @classmethod
    def from_knobs(
        cls,
        num_steps: int | None,
        topk: int | None,
        num_draft_tokens: int | None,
        num_speculative_tokens: int | None,
        default: "TreeShape | None" = None,
    ) -> "TreeShape":
        """The shape the command-line knobs ask for: vLLM's chain k alone, or SGLang's S/K/N, each
        omitted one from `default` (DEFAULT_TREE)."""
        if num_speculative_tokens is not None:
            if any(v is not None for v in (num_steps, topk, num_draft_tokens)):
                raise EaglewireError(
                    "give either the chain knob or the tree knobs",
                    expected="--num-speculative-tokens alone, or --num-steps/--topk/--num-draft-tokens",
                    found="both",
                )
            return cls.chain(num_speculative_tokens)
        base = default or DEFAULT_TREE
        steps, k = num_steps or base.num_steps, topk or base.topk
        # a chain (K=1) verifies exactly S drafted tokens: --topk 1 --num-steps S alone means N = S+1
        n = num_draft_tokens or (steps + 1 if k == 1 else base.num_draft_tokens)
        return cls(num_steps=steps, topk=k, num_draft_tokens=n)


# The tree of `generate`, `serve`, `bench` and the run config's bench section (defined here only). Small:
# on a CPU a verify costs more decode steps the more tokens it holds, by a ratio that differs between
# machines (measured by `python -m benchmarks.decoding.bench_verify`), and with the released draft a deeper tree's
# extra accepted tokens do not pay for its larger verify (`eaglewire bench` compares tree shapes).
DEFAULT_TREE = TreeShape(num_steps=2, topk=2, num_draft_tokens=3)


@dataclass
class DraftTree:
    """Drafted nodes in topological order (parents first). Target ids."""

    tokens: list[int]
    parents: list[int]  # index of the parent node, -1 = the root (the pending token)

    @property
    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def verify_inputs(
        self, root: int, n: int, device: torch.device | str = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [1, 1+M], positions [1, 1+M], mask bool [1, 1, 1+M, n+1+M]) for a target whose cache holds n
        tokens: the root is slot n at position n, node i is slot n+1+i at position n+depth_i; every slot sees
        the prefix, itself and its ancestors."""
        M = len(self.tokens)
        ids = torch.tensor([[root] + self.tokens], device=device)
        pos = torch.tensor([[n] + [n + d for d in self.depths]], device=device)
        mask = torch.zeros(1 + M, n + 1 + M, dtype=torch.bool, device=device)
        mask[:, : n + 1] = True  # prefix and root
        for i, p in enumerate(self.parents):
            row = 1 + i
            mask[row, n + 1 + i] = True
            if p >= 0:
                mask[row, n + 1 :] |= mask[1 + p, n + 1 :]  # the parent's ancestors (and the parent)
        return ids, pos, mask[None, None]


def greedy_accept(tree: DraftTree, target_argmax: list[int]) -> tuple[list[int], int]:
    """Walk from the root: follow the child whose token is the target's argmax. target_argmax[0] is the
    root's, [1+i] node i's. Returns (accepted node indices along the path, bonus token)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    cur_pred, cur = target_argmax[0], -1
    while True:
        nxt = next((c for c in children.get(cur, []) if tree.tokens[c] == cur_pred), None)
        if nxt is None:
            return path, cur_pred
        path.append(nxt)
        cur, cur_pred = nxt, target_argmax[1 + nxt]


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """[..., V] logits -> the target's sampling distribution (temperature, then nucleus top-p)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_accept(tree: DraftTree, probs: torch.Tensor, gen: torch.Generator) -> tuple[list[int], int]:
    """Lossless acceptance for sampling. Drafted children are deterministic proposals (top-k), i.e. point
    masses, so at a node with target distribution p the children c1, c2, ... are tried in turn: accept c
    with probability r(c)/sum(r), else set r(c) = 0; if all are rejected, draw the bonus from r/sum(r).
    Then P(emit c1) = p(c1), P(emit c2) = (1-p(c1)) * p(c2)/(1-p(c1)) = p(c2), and every other token
    keeps p(x): the emitted token is an exact sample of p (statistical test in the suite).
    probs: [1+M, V], row 0 the root's, row 1+i node i's."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    cur = -1
    while True:
        r = probs[0 if cur < 0 else 1 + cur].clone()
        nxt = None
        for c in children.get(cur, []):
            tok = tree.tokens[c]
            if r[tok] > 0 and float(torch.rand((), generator=gen)) * float(r.sum()) < float(r[tok]):
                nxt = c
                break
            r[tok] = 0.0
        if nxt is None:
            return path, int(torch.multinomial(r / r.sum(), 1, generator=gen))
        path.append(nxt)
        cur = nxt
