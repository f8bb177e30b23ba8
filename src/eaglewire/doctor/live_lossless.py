"""Why an engine's greedy answer differs from the target's own: a near-tie read through other rounding, or a fault.

Greedy speculative decoding returns the target's argmax at every step, but "the target's argmax" depends on
the arithmetic that computed the logits: a server verifying N rows at a time through other GEMM layouts (or in
another dtype) sums in another order than our reference, and where the target's two best tokens are closer than
that rounding, the two pick different tokens and the answers part from there on. That is not a lossless fault.
A token the target ranks well below its best IS one (a wrong verify, a sampler where greedy was asked, another
model or chat template). So for each answer that differs:

    k      = the reference tokens the engine's text shares (decoded prefix)       ref[:k] == engine's start
    theirs = the engine's next token (its remaining text re-tokenised; EOS where it stopped)
    margin = logit(target's best) - logit(theirs), one forward of the target on prompt + ref[:k]

and the answer parts at a near-tie when margin <= TIE_LOGITS of the dtype the two sides compare in. Every
mismatch gets its cause named in the verdict (doctor/live.py compare): ties -> the verdict stands and says so;
anything else -> `not_lossless`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eaglewire.target.protocol import RunnableTarget

# The largest logit move on the embedded target when the same tokens go through other GEMM shapes (a batched
# prefill against one-row cached decoding): 6.6e-5 in float32, 1.0 in bfloat16; 0.77 between the float32 and the
# bfloat16 target (benchmarks/results/live_probe/*-epyc-avx512/logit_spread.json, benchmarks/doctor/logit_spread.py).
# A tie is a margin within ~15x the float32 figure where both sides compute in float32, else within twice the
# bfloat16 one (either side in bf16, or an engine that does not report its dtype).
TIE_LOGITS = {"float32": 1e-3, "bfloat16": 2.0}


@dataclass
class Divergence:
    answer: int  # which prompt
    token: int  # reference tokens before the first difference
    ours: str  # the target's greedy token there (decoded)
    theirs: str  # the engine's token there (decoded; "<eos>" where it stopped)
    margin: float  # logit(best) - logit(theirs) in the reference's dtype; >= 0


def _shared_prefix(tok: Any, ref: list[int], text: str) -> int:
    """The most reference tokens whose decoded text starts the engine's text."""
    k = 0
    while k < len(ref) and text.startswith(tok.decode(ref[: k + 1], skip_special_tokens=True)):
        k += 1
    return k


def first_divergence(
    target: RunnableTarget, prompt: torch.Tensor, ref: list[int], text: str, answer: int
) -> Divergence:
    """Where the engine's text leaves the reference tokens `ref`, and the target's margin against its token
    there (prompt [1, P]: the chat-rendered prompt both sides decoded from)."""
    tok = target.tokenizer
    k = _shared_prefix(tok, ref, text)
    rest = text[len(tok.decode(ref[:k], skip_special_tokens=True)) :]
    pieces = tok(rest, add_special_tokens=False)["input_ids"] if rest else []
    theirs = pieces[0] if pieces else tok.eos_token_id
    ids = torch.cat([prompt, torch.tensor([ref[:k]], dtype=prompt.dtype)], dim=1)  # [1, P + k]
    with torch.no_grad():
        logits = target.model(ids).logits[0, -1].float()  # [V]
    ours = ref[k] if k < len(ref) else int(logits.argmax())
    margin = float(logits.max() - logits[theirs])
    name = lambda t: "<eos>" if t == tok.eos_token_id else tok.decode([t])  # noqa: E731
    return Divergence(answer, k, name(ours), name(theirs), max(margin, 0.0))


def divergences(
    target: RunnableTarget,
    prompts: list[torch.Tensor],
    ref_tokens: list[list[int]],
    engine_texts: list[str],
    ref_texts: list[str],
) -> list[Divergence]:
    """One Divergence per answer whose text differs from the reference's."""
    return [
        first_divergence(target, p, r, e, i)
        for i, (p, r, e, o) in enumerate(zip(prompts, ref_tokens, engine_texts, ref_texts))
        if e != o
    ]


def tie_tolerance(ours: str, engine: str | None) -> float:
    """The margin read as rounding: float32's where both sides are known to compute in float32."""
    return TIE_LOGITS["float32"] if ours == engine == "float32" else TIE_LOGITS["bfloat16"]


def numerics_line(ours: str, engine: dict[str, Any] | None) -> str:
    """What each side computed in, for the verdict."""
    if not engine or not engine.get("dtype"):
        return f"our reference: target {ours}, plain runtime; the engine does not report its dtype"
    return (
        f"our reference: target {ours}, plain runtime; the engine: target {engine['dtype']}, "
        f"{engine.get('runtime', 'its')} runtime, verifying {engine.get('shape', 'its shape')}"
    )


def judge(divs: list[Divergence], same_template: bool, tol: float, numerics: str) -> tuple[bool, str]:
    """(lossless, the cause named): every difference a tie within `tol`, or the reason it is not."""
    if not divs:
        return True, ""
    where = "; ".join(
        f"answer {d.answer + 1} at token {d.token}: the engine's {d.theirs!r} is {d.margin:.2g} "
        f"logits below the target's {d.ours!r}"
        for d in divs
    )
    if not same_template:
        return False, (
            f"{len(divs)} answer(s) differ and the engine's prompt lengths differ from ours: another chat "
            f"template (compare the server's template with the target's) — {where}"
        )
    if all(d.margin <= tol for d in divs):
        return True, (
            f"{len(divs)} answer(s) part at a near-tie of the target, within the rounding of the two "
            f"sides' arithmetic (<= {tol:g} logits; {numerics}) — {where}"
        )
    return False, (
        f"{len(divs)} answer(s) differ beyond rounding (> {tol:g} logits; {numerics}): the engine did "
        f"not return the target's greedy tokens — a lossless fault, sampling where greedy was asked, or "
        f"another model — {where}"
    )
