"""Re-answer every assistant turn with the target itself (EAGLE-3/HASS/SpecForge all train on the
target's own answers: raw ShareGPT answers stall acceptance).

Turn k of a conversation is generated conditioned on the *regenerated* history. Output is an
append-only gzip JSONL (one gzip member per batch) keyed by conversation id, in OpenAI `messages`
form, with a `.meta.json` sidecar naming the target and the settings. Killing the run and starting it
again continues where it stopped: a cut-off final member is dropped (atomically rewritten), finished ids
are skipped, nothing is duplicated or lost. A generator that answers one chat at a time (`chat_one`:
a serving engine) is kept full by a rolling pool of whole conversations instead of batches.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from eaglewire.data.conversations import Conversation, ReadStats, read_conversations
from eaglewire.data.regen_file import append_records, check_meta, read_done
from eaglewire.errors import EaglewireError
from eaglewire.outputs import output_lock

T = TypeVar("T")


# Conversations a serving engine keeps in flight (vLLM's CPU build, or --server): its throughput rises with
# the requests in flight until the cores are busy (benchmarks/data/regen_concurrency.sh measures it). HF
# generate's batch (GenerationSettings.batch_size) is another knob: it pads a batch to its longest answer.
SERVER_IN_FLIGHT = 64


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_turns: int = 2  # user turns answered per conversation (more distinct prompts beat long chats)
    max_prompt_tokens: int = 1024  # a turn whose rendered prompt is longer ends the conversation there
    batch_size: int = 8


@dataclass
class Reply:
    text: str
    new_tokens: int
    finish: str  # "stop" | "length"


class Generator(Protocol):
    def prompt_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def generate(self, prompts: list[list[dict[str, str]]], seed: int) -> list[Reply]: ...

    def identity(self) -> dict: ...


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------


@dataclass
class RegenStats:
    conversations: int = 0
    turns: int = 0
    new_tokens: int = 0
    skipped_long: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def _batches(convs: Iterable[Conversation], size: int, window: int = 8) -> Iterator[list[Conversation]]:
    """Group conversations of similar first-prompt length (less padding), in a bounded window."""
    pool: list[Conversation] = []
    for c in convs:
        pool.append(c)
        if len(pool) == size * window:
            pool.sort(key=lambda c: len(c.user_turns[0]))
            yield from (pool[i : i + size] for i in range(0, len(pool), size))
            pool = []
    pool.sort(key=lambda c: len(c.user_turns[0]))
    yield from (pool[i : i + size] for i in range(0, len(pool), size) if pool[i : i + size])


def _regenerate_batch(
    gen: Generator, batch: list[Conversation], s: GenerationSettings, seed: int, stats: RegenStats
) -> list[dict]:
    history: dict[str, list[dict]] = {c.id: [t.__dict__ for t in c.turns if t.role == "system"] for c in batch}
    finish: dict[str, list[str]] = {c.id: [] for c in batch}
    active = list(batch)
    for k in range(s.max_turns):
        prompts, owners = [], []
        for c in active:
            if k >= len(c.user_turns):
                continue
            msgs = history[c.id] + [{"role": "user", "content": c.user_turns[k]}]
            if gen.prompt_tokens(msgs) <= s.max_prompt_tokens:
                prompts.append(msgs)
                owners.append(c)
        if not prompts:
            break
        for c, msgs, reply in zip(owners, prompts, gen.generate(prompts, seed=seed * 1000 + k)):
            history[c.id] = msgs + [{"role": "assistant", "content": reply.text}]
            finish[c.id].append(reply.finish)
            stats.turns += 1
            stats.new_tokens += reply.new_tokens
        active = owners
    out = []
    for c in batch:
        if finish[c.id]:
            out.append({"id": c.id, "messages": history[c.id], "finish": finish[c.id]})
        else:
            stats.skipped_long += 1
            out.append({"id": c.id, "skipped": "prompt too long"})  # recorded so a resume does not retry
    return out


def regen_meta(source: str | Path, s: GenerationSettings, gen: Generator, start: int = 0) -> dict:
    """What identifies a regeneration file's contents (its `.meta.json` sidecar)."""
    # batch_size is a throughput knob, not part of the data's identity: a resume may change it.
    settings = {k: v for k, v in asdict(s).items() if k != "batch_size"}
    meta = {"source": str(source), "settings": settings, "generator": gen.identity()}
    if start:  # a file of conversations [start, start + limit) (another file holds the ones before)
        meta["start"] = start
    return meta


def _todo(source: str, done: set[str], limit: int, start: int, read_stats: ReadStats | None) -> Iterator[Conversation]:
    # Conversations [start, start + limit) of the source minus those already in the file: which
    # conversations a file holds depends only on (start, limit), never on how often it was resumed.
    first = (c for i, c in zip(range(start + limit), read_conversations(source, read_stats)) if i >= start)
    return (c for c in first if c.id not in done)


def regenerate(
    source: str,
    out: Path,
    gen: Generator,
    s: GenerationSettings,
    *,
    limit: int,
    start: int = 0,
    on_batch: Callable[[RegenStats, int], None] | None = None,
    read_stats: ReadStats | None = None,
) -> RegenStats:
    """Regenerate conversations [start, start + limit) of `source` into `out` (resuming if it exists).
    A generator with `chat_one` (a serving engine) is kept full by a rolling pool instead of batches."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):  # one writer per file: two appending runs would duplicate records
        return _regenerate(source, out, gen, s, limit=limit, start=start, on_batch=on_batch, read_stats=read_stats)


def _regenerate(
    source: str,
    out: Path,
    gen: Generator,
    s: GenerationSettings,
    *,
    limit: int,
    start: int,
    on_batch: Callable[[RegenStats, int], None] | None,
    read_stats: ReadStats | None,
) -> RegenStats:
    check_meta(out, regen_meta(source, s, gen, start))
    done = {r["id"] for r in read_done(out, repair=True)}
    stats = RegenStats(conversations=len(done))
    todo = _todo(source, done, limit, start, read_stats)
    if hasattr(gen, "chat_one"):
        return regenerate_rolling(gen, todo, out, s, stats, on_batch)
    t0 = time.perf_counter()
    for i, batch in enumerate(_batches(todo, s.batch_size)):
        records = _regenerate_batch(gen, batch, s, seed=s.seed + len(done) + i, stats=stats)
        append_records(out, records)
        stats.conversations += len(records)
        stats.seconds = time.perf_counter() - t0
        if on_batch:
            on_batch(stats, len(records))
    return stats


# --------------------------------------------------------------------------------------------------
# The rolling pool (serving engines)
# --------------------------------------------------------------------------------------------------
# Batches (`_regenerate_batch`) wait for their slowest request, and turn 2 waits for every turn 1 of the
# batch; an engine with continuous batching (vLLM, SGLang) then idles. Here each worker owns one
# conversation (its turns in order, each conditioned on the regenerated history) and takes the next one
# as soon as it finishes, so `batch_size` requests are in flight all the time. Finished conversations
# are appended every `flush_every` completions (one gzip member each, as the batch path writes): a kill
# loses at most the conversations in flight, redone on resume. Output order is completion order;
# readers select by id.


class ChatGenerator(Protocol):
    def prompt_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def chat_one(self, messages: list[dict[str, str]], seed: int) -> Reply: ...


def regenerate_conversation(
    gen: ChatGenerator, c: Conversation, s: GenerationSettings, seed: int, lock: threading.Lock
) -> tuple[dict, int, int]:
    """One conversation's record, its answered turns and new tokens. A turn whose prompt is too long
    ends the conversation there (as in the batch path); none answered -> a 'skipped' record."""
    history = [t.__dict__ for t in c.turns if t.role == "system"]
    finish: list[str] = []
    tokens = 0
    for k, user in enumerate(c.user_turns[: s.max_turns]):
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


def rolling(jobs: Iterable[Callable[[], T]], width: int) -> Iterator[T]:
    """Each job's result as soon as it finishes, `width` jobs in flight. A failed job raises here. On a kill
    (Ctrl-C), a failure or the consumer stopping, jobs in flight are dropped, not waited for (a resume redoes
    them): waiting could take up to `width` long answers."""
    pool, pending = ThreadPoolExecutor(max_workers=width), set()
    try:
        for job in jobs:
            pending.add(pool.submit(job))
            if len(pending) >= width:  # keep exactly `width` in flight
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in finished)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (f.result() for f in finished)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def regenerate_rolling(
    gen: ChatGenerator,
    todo: Iterator[Conversation],
    out: Path,
    s: GenerationSettings,
    stats: RegenStats,
    on_batch: Callable[[RegenStats, int], None] | None = None,
    flush_every: int | None = None,
) -> RegenStats:
    """`s.batch_size` conversations in flight; append finished ones every `flush_every` (default batch_size)."""
    flush_every = flush_every or s.batch_size
    lock, buffer = threading.Lock(), []
    t0, first = time.perf_counter(), stats.conversations

    def flush() -> None:
        append_records(out, buffer)
        stats.conversations += len(buffer)
        stats.seconds = time.perf_counter() - t0
        if on_batch:
            on_batch(stats, len(buffer))
        buffer.clear()

    jobs = (partial(regenerate_conversation, gen, c, s, s.seed + first + i, lock) for i, c in enumerate(todo, 1))
    try:
        for record, turns, tokens in rolling(jobs, s.batch_size):  # a failed request stops the run
            buffer.append(record)
            stats.turns, stats.new_tokens = stats.turns + turns, stats.new_tokens + tokens
            stats.skipped_long += "skipped" in record
            if len(buffer) >= flush_every:
                flush()
    finally:
        if buffer:  # keep what finished, also on a kill
            flush()
    return stats


# --------------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------------


class LocalGenerator:
    """Batched HF `generate` on the local target (left padding, per-batch seed)."""

    def __init__(self, target, s: GenerationSettings) -> None:
        self.t, self.s = target, s
        tok = target.tokenizer
        if tok is None or target.chat_template is None:
            raise EaglewireError(
                "regeneration needs the target's tokenizer and chat template",
                expected="tokenizer.chat_template",
                found="none",
            )
        self.pad = target.pad_id
        self.eos = tok.eos_token_id

    def identity(self) -> dict:
        return {"kind": "local", "target": self.t.identity.config_sha256, "name": self.t.name}

    def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        return list(
            self.t.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self._encode(messages))

    def generate(self, prompts: list[list[dict[str, str]]], seed: int) -> list[Reply]:
        import torch  # here, not at module level: the CLI's arithmetic commands import this module's settings

        enc = [self._encode(m) for m in prompts]
        width = max(map(len, enc))
        dev = self.t.device  # the target's: regeneration runs where the target was loaded
        ids = torch.tensor([[self.pad] * (width - len(e)) + e for e in enc], device=dev)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=dev)
        torch.manual_seed(seed)
        sample = self.s.temperature > 0
        with torch.no_grad():
            out = self.t.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.s.max_new_tokens,
                do_sample=sample,
                temperature=self.s.temperature if sample else None,
                top_p=self.s.top_p if sample else None,
                top_k=None,
                pad_token_id=self.pad,
                eos_token_id=self.eos,
            )
        replies = []
        for row in out[:, width:].tolist():
            n = row.index(self.eos) + 1 if self.eos in row else len(row)
            text = self.t.tokenizer.decode(row[:n], skip_special_tokens=True)
            replies.append(Reply(text=text, new_tokens=n, finish="stop" if self.eos in row[:n] else "length"))
        return replies
