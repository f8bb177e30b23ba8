"""The evidence the empirical wiring check scores drafts on: every residual-stream boundary of the
target, captured ONCE on a few built-in prompts and the target's own greedy continuation of them.

Greedy continuation, because the tokens a deployed draft is judged on are the target's greedy tokens:
at an answer position the label is exactly what the engine verifies. Every candidate tap set is then
a gather over the stored boundaries (no second target forward), so all candidates are scored on the
SAME tokens and their differences are paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from eaglewire.capture.hooks import capture
from eaglewire.data.template import chat_ids
from eaglewire.target.loader import Target

PROMPTS = (  # short, varied first turns (writing, reasoning, coding, facts): the draft's everyday diet
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
    "What are three tips for staying focused while studying?",
    "Write a Python function that reverses a string.",
    "Summarize the plot of Romeo and Juliet.",
    "If a train travels 60 miles in 1.5 hours, what is its average speed?",
    "Give me a recipe for a simple tomato soup.",
    "What is the difference between weather and climate?",
)
NEW_TOKENS = 96  # per prompt: 8 x 96 ~ 600 scored answer tokens (seconds of greedy generation for a small
# target); about half as many leave a one-layer shift of the released draft inside the bootstrap margin
NO_TOKENIZER_PROMPT_LEN = 16  # a target without a tokenizer gets seeded random-id prompts of this length


@dataclass
class Boundaries:
    """Every boundary 0..L of the target on right-padded sequences (prompt + greedy continuation)."""

    states: torch.Tensor  # [L+1, B, T, H] boundary b = states[b]
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T] the target's top-1 after position t (predicts token t+1)
    scored: torch.Tensor  # bool [B, T]: label t counts (an answer position of a real token)

    @property
    def num_layers(self) -> int:
        return self.states.shape[0] - 1

    def taps(self, boundaries: Sequence[int]) -> torch.Tensor:
        """[B, T, n*H]: the concatenation an engine delivers for these boundaries (ascending)."""
        return torch.cat([self.states[b] for b in boundaries], dim=-1)


def builtin_prompts(target: Target) -> list[torch.Tensor]:
    """The built-in prompts as token ids [T] (chat template when the target has one)."""
    tok = target.tokenizer
    if tok is None:  # test targets built in-process: seeded random ids (the target's greedy text follows)
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, target.vocab_size, (NO_TOKENIZER_PROMPT_LEN,), generator=g) for _ in PROMPTS]
    if getattr(tok, "chat_template", None):
        return [chat_ids(tok, p)[0] for p in PROMPTS]
    return [tok(p, return_tensors="pt")["input_ids"][0] for p in PROMPTS]


@torch.no_grad()
def _greedy(target: Target, prompts: list[torch.Tensor], new_tokens: int) -> list[torch.Tensor]:
    """prompt + the target's greedy continuation (stopped after EOS), one batched generate call."""
    pad = target.pad_id if target.tokenizer is not None else 0
    eos = target.tokenizer.eos_token_id if target.tokenizer is not None else None
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long, device="cpu")  # [B, Tp] left-padded, host
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    out = target.model.generate(
        input_ids=ids.to(target.device),
        attention_mask=mask.to(target.device),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=eos,
    ).cpu()  # [B, Tp + new]
    seqs = []
    for i, p in enumerate(prompts):
        answer = out[i, width:]
        stop = (answer == eos).nonzero() if eos is not None else answer.new_zeros((0, 1))
        seqs.append(torch.cat([p, answer[: int(stop[0]) + 1] if len(stop) else answer]))
    return seqs


@torch.no_grad()
def sample_target(
    target: Target,
    prompts: list[torch.Tensor] | None = None,
    *,
    new_tokens: int = NEW_TOKENS,
    score_prompt: bool = False,
) -> Boundaries:
    """Capture every boundary once. `score_prompt` also scores the prompt's positions (given prompts that
    are in the draft's training distribution, e.g. the tiny test data); the default scores answers only."""
    prompts = prompts if prompts is not None else builtin_prompts(target)
    seqs = _greedy(target, prompts, new_tokens) if new_tokens else list(prompts)
    T = max(len(s) for s in seqs)
    ids = torch.zeros(
        (len(seqs), T), dtype=torch.long, device="cpu"
    )  # [B, T] right-padded, host: real tokens never see pads
    mask = torch.zeros_like(ids)
    scored = torch.zeros_like(ids, dtype=torch.bool)
    for i, (s, p) in enumerate(zip(seqs, prompts)):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
        # label t predicts token t+1; answers start at token len(p), so label len(p)-1 is the first answer one
        scored[i, (0 if score_prompt else len(p) - 1) : len(s) - 1] = True
    L, H = target.num_layers, target.hidden_size
    cap = capture(target, tuple(range(L + 1)), ids.to(target.device), mask.to(target.device), logits=True)
    # computed where the target runs, kept on the CPU: the doctor's checks read them beside CPU-side data
    states = cap.taps.view(len(seqs), T, L + 1, H).permute(2, 0, 1, 3).float().cpu()  # [L+1, B, T, H]
    labels = cap.logits.argmax(-1).cpu()  # [B, T]
    return Boundaries(states=states.contiguous(), input_ids=ids, labels=labels, scored=scored & mask.bool())
