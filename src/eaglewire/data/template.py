"""Chat-template rendering and the assistant loss mask, found by render boundaries (no per-model regex).

For assistant turn i of messages m:
    before_i = render(m[:i], add_generation_prompt=True)     # what the target saw when it answered
    upto_i   = render(m[:i+1])                                # ... plus its answer
    full     = render(m)
The answer is the text upto_i[len(before_i):]. It is only trusted if `before_i` is a prefix of `upto_i`
and `upto_i` is a prefix of `full`; otherwise the template rewrites history (Qwen3 drops earlier
`<think>` blocks) and we raise `TemplateMismatch`, or, with `split_turns`, make one sample per turn.
Tokens are marked by character offsets of one tokenisation of the final text, so BPE merges at turn
boundaries cannot shift the mask. Text after the tokenizer's end-of-turn token inside the answer span
(ChatML's trailing "\n") is template glue the model never generates, so it is not trained on.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from eaglewire.errors import EaglewireError

if TYPE_CHECKING:
    import torch


class TemplateMismatch(EaglewireError):
    """The chat template renders earlier history differently depending on what follows it."""


@dataclass
class Rendered:
    text: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 on tokens the target generated (assistant answers), 0 elsewhere
    spans: list[tuple[int, int]]  # character spans of the assistant answers in `text`

    @property
    def num_masked(self) -> int:
        return sum(self.loss_mask)


def _render(tok: Any, messages: list[dict], gen_prompt: bool, template: str | None, kwargs: dict) -> str:
    return tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen_prompt, chat_template=template, **kwargs
    )


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _mismatch(what: str, turn: int, shorter: str, longer: str) -> TemplateMismatch:
    i = _first_difference(shorter, longer)
    return TemplateMismatch(
        f"chat template renders assistant turn {turn} differently {what}",
        expected=repr(shorter[max(0, i - 30) : i + 30]),
        found=repr(longer[max(0, i - 30) : i + 30]),
        fix="pass split_turns=True (--split-turns) to train one sample per assistant turn; needed for "
        "templates that rewrite earlier turns, e.g. Qwen3 dropping <think> from history",
    )


def _turn_span(tok: Any, messages: list[dict], i: int, template: str | None, kw: dict) -> tuple[str, int]:
    """(render up to and including assistant turn i, where its answer starts in that render)."""
    before = _render(tok, messages[:i], True, template, kw)
    upto = _render(tok, messages[: i + 1], False, template, kw)
    if not upto.startswith(before):
        raise _mismatch("with and without the generation prompt", i, before, upto)
    return upto, len(before)


def assistant_spans(
    tok: Any, messages: list[dict], *, template: str | None = None, template_kwargs: dict | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """Full rendered text and the character span of every assistant answer in it."""
    kw = template_kwargs or {}
    full = _render(tok, messages, False, template, kw)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        upto, start = _turn_span(tok, messages, i, template, kw)
        if not full.startswith(upto):
            raise _mismatch("inside later history", i, upto, full)
        spans.append((start, len(upto)))
    return full, spans


def _trim_glue(text: str, span: tuple[int, int], end_tokens: list[str]) -> tuple[int, int]:
    start, end = span
    answer = text[start:end]
    cuts = [answer.rfind(t) + len(t) for t in end_tokens if t and answer.rfind(t) >= 0]
    return (start, start + max(cuts)) if cuts else span


_END_TOKENS: "weakref.WeakKeyDictionary[Any, list[str]]" = weakref.WeakKeyDictionary()


def _end_tokens(tok: Any) -> list[str]:
    # Cached per tokenizer: get_vocab() builds a dict of the whole vocabulary on every call, which made
    # tokenizing thousands of conversations take minutes.
    if tok not in _END_TOKENS:
        vocab = tok.get_vocab()
        ends = {tok.eos_token} if getattr(tok, "eos_token", None) else set()
        ends |= {
            t for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>") if t in vocab
        }  # end-of-turn specials
        _END_TOKENS[tok] = sorted(ends)
    return _END_TOKENS[tok]


def _tokenize_with_mask(tok: Any, text: str, spans: list[tuple[int, int]]) -> Rendered:
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ends = _end_tokens(tok)
    spans = [_trim_glue(text, s, ends) for s in spans]
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return Rendered(text=text, input_ids=list(enc["input_ids"]), loss_mask=mask, spans=spans)


def render_with_mask(
    tok: Any,
    messages: list[dict],
    *,
    template: str | None = None,
    template_kwargs: dict | None = None,
    split_turns: bool = False,
) -> list[Rendered]:
    """Render a conversation and mask its assistant tokens. One sample, or one per assistant turn
    (each ending at that turn, only that turn masked) with `split_turns`."""
    if not split_turns:
        text, spans = assistant_spans(tok, messages, template=template, template_kwargs=template_kwargs)
        return [_tokenize_with_mask(tok, text, spans)]
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":  # only this turn is trained; earlier turns are context as rendered
            text, start = _turn_span(tok, messages, i, template, template_kwargs or {})
            out.append(_tokenize_with_mask(tok, text, [(start, len(text))]))
    return out


# one user message, or chat messages [{"role": "system" | "user" | "assistant", "content": "..."}, ...]
Prompt = Union[str, Sequence[Mapping[str, str]]]


def messages_of(prompt: Prompt) -> list[dict[str, str]]:
    """The chat messages a prompt stands for: a string is one user message; a list is checked message by message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    fix = 'pass a string, or messages like [{"role": "user", "content": "Hi."}]'
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence) or not prompt:
        raise EaglewireError(
            "a prompt is one user message or a non-empty list of chat messages",
            expected="a str, or a list of {'role': ..., 'content': ...}",
            found=type(prompt).__name__ if prompt else "an empty list",
            fix=fix,
        )
    out = []
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EaglewireError(
                f"chat message {i} is not a role and a text",
                expected="{'role': str, 'content': str}",
                found=repr(m)[:200],
                fix=fix,
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def chat_ids(tokenizer: Any, prompt: Prompt) -> torch.Tensor:
    """The prompt rendered with the tokenizer's chat template and its generation prompt: ids [1, P]."""
    messages = messages_of(prompt)
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise EaglewireError(
            "the prompt cannot be rendered: the target has no chat template",
            expected="a target whose tokenizer has a chat template (an instruct / chat model)",
            found="no tokenizer" if tokenizer is None else "a tokenizer without chat_template",
            fix="load an instruct model, or set tokenizer.chat_template",
        )
    ids: torch.Tensor = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    return ids  # [1, P]
