"""Tokenised training samples: conversations -> (input_ids, loss_mask), and the train/held-out split."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from eaglewire.data.conversations import Conversation, ReadStats, read_conversations
from eaglewire.data.template import TemplateMismatch, render_with_mask
from eaglewire.errors import EaglewireError

if TYPE_CHECKING:  # torch is imported where samples are made: the CLI reads this module's defaults
    import torch


@dataclass
class Sample:
    id: str
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # int64 [T], 1 on target-generated (assistant) tokens


@dataclass
class TokenizeStats:
    conversations: int = 0
    samples: int = 0
    tokens: int = 0
    masked_tokens: int = 0
    truncated: int = 0
    template_mismatch: int = 0
    no_answer: int = 0

    def summary(self) -> str:
        return (
            f"{self.samples} samples from {self.conversations} conversations, {self.tokens} tokens "
            f"({self.masked_tokens} trained on); truncated {self.truncated}, skipped: template mismatch "
            f"{self.template_mismatch}, no answer tokens {self.no_answer}"
        )


DEFAULT_MAX_LENGTH = 1024  # tokens per training sample (longer ones are truncated)
DEFAULT_HELDOUT_FRACTION = 0.05  # share of sample ids held out for evaluation (by hash: stable as data grows)


def is_held_out(sample_id: str, fraction: float) -> bool:
    """Deterministic split by id hash: stable across runs, resumes and data growth."""
    h = int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16)
    return h < fraction * 0x100000000


def _split_key(sample_id: str) -> str:
    """The id a sample is split by: its conversation's, so all turns of one conversation (--split-turns)
    land on the same side. Spelt as the conversation's first sample (`conv#0`), the key is exactly the
    id that was hashed before turns were split by conversation: non-split data keeps its split."""
    conv, sep, turn = sample_id.rpartition("#")
    return f"{conv}#0" if sep and turn.isdigit() else sample_id


def split_heldout(samples: list[Sample], fraction: float) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples, in their order, split by conversation; the one split the vocab and
    training both use."""
    held = [is_held_out(_split_key(s.id), fraction) for s in samples]
    return [s for s, h in zip(samples, held) if not h], [s for s, h in zip(samples, held) if h]


def tokenize_conversations(
    tok: Any,
    convs: Iterable[Conversation],
    *,
    max_length: int,
    split_turns: bool = False,
    template_kwargs: dict | None = None,
    stats: TokenizeStats | None = None,
) -> list[Sample]:
    """Render with the target's own chat template; truncate to max_length; skip (and count) samples
    without any trained token and templates that rewrite history (unless split_turns)."""
    import torch

    stats = stats if stats is not None else TokenizeStats()
    out, seen = [], stats.conversations
    for conv in convs:
        stats.conversations += 1
        try:
            rendered = render_with_mask(tok, conv.messages(), split_turns=split_turns, template_kwargs=template_kwargs)
        except TemplateMismatch:
            stats.template_mismatch += 1
            continue
        for j, r in enumerate(rendered):
            ids, mask = r.input_ids[:max_length], r.loss_mask[:max_length]
            stats.truncated += len(r.input_ids) > max_length
            if not any(mask):
                stats.no_answer += 1
                continue
            out.append(Sample(id=f"{conv.id}#{j}", input_ids=torch.tensor(ids), loss_mask=torch.tensor(mask)))
            stats.samples += 1
            stats.tokens += len(ids)
            stats.masked_tokens += sum(mask)
    if not out and stats.conversations > seen:  # conversations came, none gave a trained token: not success
        raise EaglewireError(
            "no training sample: every conversation was skipped when tokenized",
            expected="at least one conversation whose rendering keeps an assistant token within "
            f"max_length={max_length}",
            found=stats.summary(),
            fix="check the data is the target's chat data (a template "
            "mismatch: try --split-turns), or raise --max-length",
        )
    return out


def load_samples(
    data: str,
    tok: Any,
    *,
    max_length: int,
    limit: int | None = None,
    skip: int = 0,
    read_stats: ReadStats | None = None,
    **kw: Any,
) -> tuple[list[Sample], TokenizeStats]:
    """Samples of the valid conversations [skip, skip + limit) of `data` (skip: those an earlier capture
    already holds)."""
    stats = TokenizeStats()
    convs = itertools.islice(read_conversations(data, read_stats), skip, None if limit is None else skip + limit)
    return tokenize_conversations(tok, convs, max_length=max_length, stats=stats, **kw), stats
