"""Regeneration through a serving engine, kept full: a rolling pool of whole conversations.

Batches (`regenerate._regenerate_batch`) wait for their slowest request, and turn 2 waits for every
turn 1 of the batch; an engine with continuous batching (vLLM, SGLang) then idles. Here each worker
owns one conversation (its turns in order, each conditioned on the regenerated history) and takes the
next conversation as soon as it finishes, so `batch_size` requests are in flight all the time.
Finished conversations are appended every `flush_every` completions (one gzip member each, as the
batch path writes): a kill loses at most the conversations in flight, redone on resume. Output order
is completion order; readers select by id.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, Protocol

from eaglewire.data.conversations import Conversation
from eaglewire.data.regenerate import GenerationSettings, RegenStats, Reply, append_records


class ChatGenerator(Protocol):
    def prompt_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def chat_one(self, messages: list[dict[str, str]], seed: int) -> Reply: ...


def regenerate_conversation(gen: ChatGenerator, c: Conversation, s: GenerationSettings, seed: int,
                            lock: threading.Lock) -> tuple[dict, int, int]:
    """One conversation's record, its answered turns and new tokens. A turn whose prompt is too long
    ends the conversation there (as in the batch path); none answered -> a 'skipped' record."""
    history = [t.__dict__ for t in c.turns if t.role == "system"]
    finish: list[str] = []
    tokens = 0
    for k, user in enumerate(c.user_turns[:s.max_turns]):
        msgs = history + [{"role": "user", "content": user}]
        with lock:  # one tokenizer shared by the workers
            n_prompt = gen.prompt_tokens(msgs)
        if n_prompt > s.max_prompt_tokens:
            break
        reply = gen.chat_one(msgs, seed * 1000 + k)
        history = msgs + [{"role": "assistant", "content": reply.text}]
        finish.append(reply.finish)
        tokens += reply.new_tokens
    if not finish:
        return {"id": c.id, "skipped": "prompt too long"}, 0, 0
    return {"id": c.id, "messages": history, "finish": finish}, len(finish), tokens


def regenerate_rolling(gen: ChatGenerator, todo: Iterator[Conversation], out: Path, s: GenerationSettings,
                       stats: RegenStats, on_batch: Callable[[RegenStats, int], None] | None = None,
                       flush_every: int | None = None) -> RegenStats:
    """`s.batch_size` conversations in flight; append finished ones every `flush_every` (default batch_size)."""
    flush_every = flush_every or s.batch_size
    lock, pending, buffer = threading.Lock(), set(), []
    t0, index = time.perf_counter(), stats.conversations

    def flush() -> None:
        append_records(out, buffer)
        stats.conversations += len(buffer)
        stats.seconds = time.perf_counter() - t0
        if on_batch:
            on_batch(stats, len(buffer))
        buffer.clear()

    def collect(done: set[Future]) -> None:
        for f in done:
            record, turns, tokens = f.result()  # a failed request stops the run (a resume redoes it)
            buffer.append(record)
            stats.turns, stats.new_tokens = stats.turns + turns, stats.new_tokens + tokens
            stats.skipped_long += "skipped" in record
        if len(buffer) >= flush_every:
            flush()

    pool = ThreadPoolExecutor(max_workers=s.batch_size)
    try:
        for c in todo:
            index += 1
            pending.add(pool.submit(regenerate_conversation, gen, c, s, s.seed + index, lock))
            if len(pending) >= s.batch_size:  # keep exactly batch_size conversations in flight
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                collect(finished)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            collect(finished)
    finally:
        # On a kill (Ctrl-C) or a failed request: keep what finished, drop what is in flight (a resume
        # redoes it) instead of waiting for up to batch_size long answers.
        pool.shutdown(wait=False, cancel_futures=True)
        if buffer:
            flush()
    return stats
