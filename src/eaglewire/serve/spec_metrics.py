"""The server's speculative rounds under vLLM's metric names, so one dashboard (and `eaglewire doctor live` /
`doctor watch`) reads vLLM and eaglewire alike.

vLLM's meaning of each counter (v1/spec_decode/metrics.py): num_drafts = verify rounds that carried a draft;
num_draft_tokens = draft tokens proposed (k per round); num_accepted_tokens = draft tokens accepted;
num_accepted_tokens_per_pos{position="i"} = rounds that accepted the draft token at position i, which under
prefix acceptance is the rounds that accepted more than i tokens. `depth` is the draft positions per round
(the shape's num_steps: k of a chain, the depth of a tree, the block of a block drafter); a tree proposes more
nodes than its depth, but only one path is accepted, so positions are counted along it, as vLLM counts a
chain. Every position series is written from the start (zeros before traffic), as vLLM does, so a reader
knows k before any request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"


@dataclass
class VllmSpecCounters:
    depth: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, accepted_per_round: list[int]) -> None:
        """Add one generation's rounds (SpecStats.accepted: tokens accepted in each verify round)."""
        with self.lock:
            if len(self.per_pos) < self.depth:
                self.per_pos += [0] * (self.depth - len(self.per_pos))
            for a in accepted_per_round:
                self.drafts += 1
                self.draft_tokens += self.depth
                self.accepted += a
                for i in range(min(a, len(self.per_pos))):
                    self.per_pos[i] += 1

    def prometheus(self) -> str:
        if not self.depth:
            return ""  # not speculating: no speculative series, as vLLM without a speculative config
        with self.lock:
            per_pos = self.per_pos + [0] * (self.depth - len(self.per_pos))
            rows = [
                (f"{PREFIX}num_drafts", self.drafts),
                (f"{PREFIX}num_draft_tokens", self.draft_tokens),
                (f"{PREFIX}num_accepted_tokens", self.accepted),
            ]
        text = "".join(f"# TYPE {n} counter\n{n}_total {v}\n" for n, v in rows)
        name = f"{PREFIX}num_accepted_tokens_per_pos"
        return (
            text
            + f"# TYPE {name} counter\n"
            + "".join(f'{name}_total{{position="{i}"}} {v}\n' for i, v in enumerate(per_pos))
        )
