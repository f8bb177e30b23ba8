"""Text in, text out: one chat prompt decoded speculatively, as `eaglewire generate` and `ew.generate` both do it.

The prompt (one user message, or a list of chat messages) is rendered with the target's chat template and a
generation prompt (`chat_ids`), the decoder is sized for exactly that prompt plus `max_new_tokens`
(eaglewire.compose owns the cache margin), decoding stops at the tokenizer's EOS, and the result is one frozen
`Generation`. The command line and the front door (`ew.generate`) call the same `generate_text` here, so their
texts are equal by construction; only loading the target and the draft (paths, dtypes) is each surface's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


from eaglewire.compose import Draft, decoder, proposal_shape
from eaglewire.data.template import Prompt, chat_ids, messages_of
from eaglewire.decoding.tree import TreeShape
from eaglewire.errors import EaglewireError
from eaglewire.target.loader import Target

__all__ = ["Generation", "Prompt", "chat_ids", "generate_text", "messages_of"]


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
        return {
            "tau": self.tau,
            "verify_steps": self.verify_steps,
            "new_tokens": len(self.tokens),
            "per_position": list(self.per_position),
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "other_s": self.prefill_s + self.decode_s - self.draft_s - self.verify_s,
            "shape": {
                "num_steps": self.shape.num_steps,
                "topk": self.shape.topk,
                "num_draft_tokens": self.shape.num_draft_tokens,
            },
        }


def generate_text(
    target: Target,
    draft: Draft,
    prompt: Prompt,
    max_new_tokens: int = 256,
    *,
    shape: TreeShape | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    compile: str = "cached",
    calibrate: str = "cached",
    accelerate: bool = True,
    log: Callable[[str], None] | None = None,
) -> Generation:
    """Speculative decoding of `prompt` (chat_ids) on `target` with `draft` (loaded, its contract inside): up to
    `max_new_tokens` new tokens, stopping at the tokenizer's EOS. shape: the tree verified per round (None: the
    draft family's default, eaglewire.compose.proposal_shape). temperature 0: greedy, lossless (plain greedy
    decoding's tokens); above 0, exact samples of the target's distribution (seeded). compile / calibrate /
    accelerate / log: eaglewire.compose.decoder's (the command line's --compile / --calibrate)."""
    if max_new_tokens < 1:
        raise EaglewireError("max_new_tokens must be at least 1", expected="an int >= 1", found=str(max_new_tokens))
    if draft.contract is None:
        raise EaglewireError(
            "the draft carries no wiring contract",
            expected="a draft loaded with ew.load_draft",
            found="draft.contract is None",
            fix="load the draft with ew.load_draft(DIR, target)",
        )
    tok = target.tokenizer
    ids = chat_ids(tok, prompt)  # [1, P]; refuses a target without a tokenizer
    assert tok is not None
    tree = proposal_shape(draft.contract, shape)
    dec = decoder(
        target,
        draft,
        tree,
        max_new_tokens,
        context=ids.shape[1] + max_new_tokens,
        accelerate=accelerate,
        calibrate=calibrate,
        compile=compile,
        log=log,
    )
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    out, st = dec.generate(ids, max_new_tokens, eos, temperature=temperature, top_p=top_p, seed=seed)
    return Generation(
        text=tok.decode(out, skip_special_tokens=True),
        tokens=tuple(out),
        prompt_tokens=int(ids.shape[1]),
        tau=st.tau,
        per_position=tuple(st.per_position(tree.num_steps)),
        verify_steps=st.verify_steps,
        prefill_s=st.prefill_s,
        decode_s=st.total_s - st.prefill_s,
        draft_s=st.draft_s,
        verify_s=st.verify_s,
        shape=tree,
    )
