"""Prompts written by the target itself (the Magpie recipe, Xu et al. 2024).

An instruct model given its chat template up to the point where a user's text begins (`pre_query_text`)
and sampled writes a user turn: questions from the distribution it was instruction-tuned on. Why we want
them: the released draft trained on ShareGPT reads 0.36 τ lower on MT-bench than on ShareGPT held-out
(teacher-forced chain, README), and ShareGPT is used up; these prompts are unlimited, cost one short
sampled completion each, and contain no benchmark text (checked: `banned_keys`).

The output is an append-only gzip JSONL in OpenAI `messages` form (one user turn per record), readable by
every conversation reader, so `data regenerate --source FILE` answers it like any other source:
    {"id": "self-0000042", "messages": [{"role": "user", "content": "..."}]}
    {"id": "self-0000043", "skipped": "unfinished"}          # drawn, not kept: a resume does not redraw it
Sample k is drawn with seed `seed + k`; the file holds samples [0, count): which ones depends only on
(settings, count), never on how often the run was resumed (a kill loses at most those in flight).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from eaglewire.data.regenerate import append_records, check_meta, read_done, rolling
from eaglewire.errors import EaglewireError

_SENTINEL = "\x00EAGLEWIRE-USER-TEXT\x00"
BAN_PREFIX_CHARS = 60  # a prompt sharing its first 60 normalized characters with a benchmark question is dropped


@dataclass(frozen=True)
class PromptSettings:
    temperature: float = 1.0  # Magpie samples at 1.0: lower makes the same few questions over and over
    top_p: float = 1.0
    max_new_tokens: int = 96  # a "question" still running at this length is usually off the rails: dropped
    min_chars: int = 16
    seed: int = 0
    batch_size: int = 64  # requests in flight (vLLM's CPU build: 64 was best for regeneration here)


@dataclass
class PromptStats:
    drawn: int = 0
    kept: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> samples dropped for it

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def pre_query_text(tokenizer: Any) -> str:
    """The rendered chat template up to where the first user message's text begins (system prompt and
    user header included, as the template writes them for a one-message chat)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise EaglewireError(
            "self-prompting needs the target's chat template",
            expected="tokenizer.chat_template",
            found="none",
            fix="use an instruct target with a chat template",
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    if _SENTINEL not in text:
        raise EaglewireError(
            "the chat template does not write the user's text verbatim",
            expected="the user message inside the rendered prompt",
            found=repr(text[:200]),
            fix="self-prompting needs a template that renders user text as given",
        )
    return text[: text.index(_SENTINEL)]


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def banned_keys(questions: Iterable[str]) -> set[str]:
    """Normalized texts and 60-character prefixes of benchmark questions (a prompt matching either is dropped)."""
    keys: set[str] = set()
    for q in questions:
        n = normalize(q)
        keys |= {n, n[:BAN_PREFIX_CHARS]}
    return keys


def judge(text: str, finish: str, s: PromptSettings, seen: set[str], banned: set[str]) -> str | None:
    """Why a sampled prompt is dropped, or None to keep it (adds it to `seen`)."""
    n = normalize(text)
    if finish != "stop":
        return "unfinished"
    if len(n) < s.min_chars:
        return "too short"
    if n in banned or n[:BAN_PREFIX_CHARS] in banned:
        return "benchmark question"
    if n in seen:
        return "duplicate"
    seen.add(n)
    return None


Sampler = Callable[[int], tuple[str, str, int]]  # seed -> (text, finish "stop" | "length", new tokens)


def sample_self_prompts(
    sample: Sampler,
    out: Path,
    count: int,
    s: PromptSettings,
    meta: dict,
    banned: set[str],
    on_batch: Callable[[PromptStats], None] | None = None,
) -> PromptStats:
    """Draw samples [0, count) into `out` (resuming: finished seeds are skipped), `s.batch_size` in flight."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # batch_size is a throughput knob, not part of the data's identity: a resume may change it
    check_meta(out, {**meta, "settings": {k: v for k, v in asdict(s).items() if k != "batch_size"}})
    done = read_done(out, repair=True)
    seen = {normalize(r["messages"][0]["content"]) for r in done if "messages" in r}
    stats = PromptStats(drawn=len(done), kept=len(seen))
    for r in done:
        if "skipped" in r:
            stats.skipped[r["skipped"]] = stats.skipped.get(r["skipped"], 0) + 1
    have = {r["id"] for r in done}
    todo = [k for k in range(count) if _rid(k) not in have]
    buffer: list[dict] = []
    t0 = time.perf_counter()

    def flush() -> None:
        append_records(out, buffer)
        buffer.clear()
        stats.seconds = time.perf_counter() - t0
        if on_batch:
            on_batch(stats)

    def draw(k: int) -> tuple[int, tuple[str, str, int]]:
        return k, sample(s.seed + k)

    jobs = (partial(draw, k) for k in todo)
    try:
        for k, (text, finish, tokens) in rolling(jobs, s.batch_size):  # a failed request stops the run
            why = judge(text, finish, s, seen, banned)
            buffer.append(
                {"id": _rid(k), "skipped": why}
                if why
                else {"id": _rid(k), "messages": [{"role": "user", "content": text.strip()}]}
            )
            stats.drawn, stats.new_tokens = stats.drawn + 1, stats.new_tokens + tokens
            if why:
                stats.skipped[why] = stats.skipped.get(why, 0) + 1
            else:
                stats.kept += 1
            if len(buffer) >= s.batch_size:
                flush()
    finally:
        if buffer:  # keep what finished, also on a kill (a resume redraws what was in flight)
            flush()
    return stats


def _rid(k: int) -> str:
    return f"self-{k:07d}"
