"""benchmarks/llamacpp/head.py: a draft's head cut to its N most frequent rows keeps exactly those rows (their
weights, their target ids), the vocabulary map and the contract agree with the new head, and a cut to more rows
than the draft has, or with counts of another head, is refused; and benchmarks/llamacpp/parts.py reads
llama-server's speculative statistics line as llama.cpp prints it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire.draft.vocab import validate_vocab_map
from eaglewire.errors import EaglewireError

from benchmarks.llamacpp.head import coverage, shrink_head  # conftest: the root on sys.path
from tests.tiny import build_draft, build_target

TARGET = build_target("llama")
DRAFT, CONTRACT = build_draft(TARGET, draft_vocab=64)


@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(0, 5), min_size=64, max_size=64), n=st.integers(1, 64))
def test_the_cut_keeps_the_most_frequent_rows_and_their_target_ids(counts, n):
    c = torch.tensor(counts, dtype=torch.int64)  # [V_d]
    small, contract = shrink_head(DRAFT, CONTRACT, c, n)
    rows = torch.tensor(sorted(sorted(range(64), key=lambda r: (-counts[r], r))[:n]))  # top n, ties by lower row
    old_ids = torch.arange(64) + DRAFT.d2t
    assert torch.equal(small.lm_head.weight, DRAFT.lm_head.weight[rows])
    assert torch.equal(torch.arange(n) + small.d2t, old_ids[rows])  # each kept row still names its target id
    validate_vocab_map(small.d2t, small.t2d, TARGET.vocab_size)
    assert int(small.t2d.sum()) == n and bool(small.t2d[old_ids[rows]].all())
    assert contract.draft_vocab_size == n == small.cfg.draft_vocab_size
    assert contract.taps == CONTRACT.taps and contract.target == CONTRACT.target
    assert torch.equal(small.fc.weight, DRAFT.fc.weight)  # the rest of the draft untouched
    assert coverage(c, int(c.sum()), 64) == (1.0 if c.sum() else 0.0)


def test_the_cut_drafts_the_kept_rows_as_before():
    c = torch.arange(64)  # the high rows are the frequent ones
    small, _ = shrink_head(DRAFT, CONTRACT, c, 16)
    h = torch.randn(3, DRAFT.cfg.hidden_size)
    assert torch.allclose(small.lm_head(h), DRAFT.lm_head(h)[:, 48:])


@pytest.mark.parametrize("n, counts", [(65, 64), (0, 64), (8, 63)])
def test_a_cut_beyond_the_trained_head_is_refused(n, counts):
    with pytest.raises(EaglewireError, match="cannot cut the draft's head"):
        shrink_head(DRAFT, CONTRACT, torch.ones(counts, dtype=torch.int64), n)


def test_the_parts_bench_reads_llama_servers_speculative_statistics():
    """benchmarks/llamacpp/parts.py's parser on lines printed with common/speculative.cpp's own format
    (common_speculative_print_stats: %16s name, %4zu/%6zu counts, ms to 3 places); the last line wins."""
    from benchmarks.llamacpp.parts import spec_stats

    fmt = (
        "statistics %16s: #calls(b,g,a) = %4d %6d %6d, #gen drafts = %6d, #acc drafts = %5d, #gen tokens = %6d, "
        "#acc tokens = %5d, #mean acc len = 1.46, #acc rate/pos = (0.456), dur(b,g,a) = %.3f, %.3f, %.3f ms"
    )
    log = "\n".join(
        "0.01.234.567 I spec common_specu: " + fmt % ("draft-eagle3", *row)
        for row in [(1, 9, 9, 9, 4, 9, 4, 0.01, 12.5, 0.1), (3, 345, 342, 345, 150, 345, 156, 0.03, 492.84, 1.2)]
    )
    assert spec_stats(log) == {
        "calls_begin": 3,
        "calls_draft": 345,
        "calls_accept": 342,
        "gen_tokens": 345,
        "acc_tokens": 156,
        "ms_begin": 0.03,
        "ms_draft": 492.84,
        "ms_accept": 1.2,
    }
    assert spec_stats("no speculative decoding here") is None
