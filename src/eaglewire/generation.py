"""Text in, text out: one chat prompt decoded speculatively, as `eaglewire generate` and `ew.generate` both do it.

The prompt (one user message, or a list of chat messages) is rendered with the target's chat template and a
generation prompt (`chat_ids`), the decoder is sized for exactly that prompt plus `max_new_tokens`
(eaglewire.compose owns the cache margin), decoding stops at the tokenizer's EOS, and the result is one frozen
`Generation`. The command line and the front door (`ew.generate`) call the same `generate_text` here, so their
texts are equal by construction; only loading the target and the draft (paths, dtypes) is each surface's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

import torch

from eaglewire.compose import Draft, decoder, proposal_shape
from eaglewire.decoding.tree import TreeShape
from eaglewire.errors import EaglewireError
from eaglewire.target.loader import Target

__all__ = ["Generation", "Prompt", "chat_ids", "generate_text", "messages_of"]

# one user message, or chat messages [{"role": "system" | "user" | "assistant", "content": "..."}, ...]
Prompt = Union[str, Sequence[Mapping[str, str]]]


@dataclass(frozen=True)
class Generation:
    """One speculative generation: the new text and token ids (EOS included when it stopped there), the
    acceptance (tau: mean tokens per verify round, the bonus token included; per_position[i]: the share of
    rounds that accepted at least i+1 drafted tokens) and the timings: prefill_s (the prompt's forward),
    decode_s (everything after it), tokens_per_s (new tokens over both), for the tree `shape` verified per round."""

    text: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    tau: float
    per_position: tuple[float, ...]
    verify_steps: int
    prefill_s: float
    decode_s: float
    draft_s: float  # within decode_s: the draft's proposals
    verify_s: float  # within decode_s: the target's verify forwards
    shape: TreeShape

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.tokens) / total if total > 0 else 0.0

    def stats(self) -> dict[str, Any]:
        """The acceptance and timings as `eaglewire generate --json` prints them under "stats"."""
        return {"tau": self.tau, "verify_steps": self.verify_steps, "new_tokens": len(self.tokens),
                "per_position": list(self.per_position), "tokens_per_s": self.tokens_per_s,
                "prefill_s": self.prefill_s, "decode_s": self.decode_s, "draft_s": self.draft_s,
                "verify_s": self.verify_s, "other_s": self.prefill_s + self.decode_s - self.draft_s - self.verify_s,
                "shape": {"num_steps": self.shape.num_steps, "topk": self.shape.topk,
                          "num_draft_tokens": self.shape.num_draft_tokens}}


def messages_of(prompt: Prompt) -> list[dict[str, str]]:
    """The chat messages a prompt stands for: a string is one user message; a list is checked message by message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    fix = 'pass a string, or messages like [{"role": "user", "content": "Hi."}]'
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence) or not prompt:
        raise EaglewireError("a prompt is one user message or a non-empty list of chat messages",
                             expected="a str, or a list of {'role': ..., 'content': ...}",
                             found=type(prompt).__name__ if prompt else "an empty list", fix=fix)
    out = []
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EaglewireError(f"chat message {i} is not a role and a text", expected="{'role': str, "
                                 "'content': str}", found=repr(m)[:200], fix=fix)
        out.append({"role": m["role"], "content": m["content"]})
    return out


def chat_ids(tokenizer: Any, prompt: Prompt) -> torch.Tensor:
    """The prompt rendered with the tokenizer's chat template and its generation prompt: ids [1, P]."""
    messages = messages_of(prompt)
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise EaglewireError("the prompt cannot be rendered: the target has no chat template",
                             expected="a target whose tokenizer has a chat template (an instruct / chat model)",
                             found="no tokenizer" if tokenizer is None else "a tokenizer without chat_template",
                             fix="load an instruct model, or set tokenizer.chat_template")
    ids: torch.Tensor = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                                      return_tensors="pt")["input_ids"]
    return ids  # [1, P]


def generate_text(target: Target, draft: Draft, prompt: Prompt, max_new_tokens: int = 256, *,
             shape: TreeShape | None = None, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             compile: str = "cached", calibrate: str = "cached", accelerate: bool = True,
             log: Callable[[str], None] | None = None) -> Generation:
    """Speculative decoding of `prompt` (chat_ids) on `target` with `draft` (loaded, its contract inside): up to
    `max_new_tokens` new tokens, stopping at the tokenizer's EOS. shape: the tree verified per round (None: the
    draft family's default, eaglewire.compose.proposal_shape). temperature 0: greedy, lossless (plain greedy
    decoding's tokens); above 0, exact samples of the target's distribution (seeded). compile / calibrate /
    accelerate / log: eaglewire.compose.decoder's (the command line's --compile / --calibrate)."""
    if max_new_tokens < 1:
        raise EaglewireError("max_new_tokens must be at least 1", expected="an int >= 1", found=str(max_new_tokens))
    if draft.contract is None:
        raise EaglewireError("the draft carries no wiring contract", expected="a draft loaded with ew.load_draft",
                             found="draft.contract is None", fix="load the draft with ew.load_draft(DIR, target)")
    tok = target.tokenizer
    ids = chat_ids(tok, prompt)  # [1, P]; refuses a target without a tokenizer
    assert tok is not None
    tree = proposal_shape(draft.contract, shape)
    dec = decoder(target, draft, tree, max_new_tokens, context=ids.shape[1] + max_new_tokens, accelerate=accelerate,
                  calibrate=calibrate, compile=compile, log=log)
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    out, st = dec.generate(ids, max_new_tokens, eos, temperature=temperature, top_p=top_p, seed=seed)
    return Generation(text=tok.decode(out, skip_special_tokens=True), tokens=tuple(out),
                      prompt_tokens=int(ids.shape[1]), tau=st.tau, per_position=tuple(st.per_position(tree.num_steps)),
                      verify_steps=st.verify_steps, prefill_s=st.prefill_s, decode_s=st.total_s - st.prefill_s,
                      draft_s=st.draft_s, verify_s=st.verify_s, shape=tree)
