"""Speculative output == plain greedy output, token for token: always-right, random and EAGLE drafts,
chain and tree, every lean-runtime architecture, EOS and max-tokens inside an accepted run."""

import pytest
import torch
from proposers import OracleProposer, RandomProposer
from extras import needs_fastcpu
from tiny import VOCAB, build_dflash, build_draft, build_target

from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.decoding.block import BlockProposer
from eaglewire.decoding.propose import EagleProposer
from eaglewire.decoding.runtime import StaticRuntime
from eaglewire.decoding.tree import DraftTree, TreeShape, greedy_accept

CHAIN, TREE = TreeShape.chain(3), TreeShape(num_steps=3, topk=2, num_draft_tokens=6)
PROMPT = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))


def _setup(arch="llama"):
    target = build_target(arch)
    return target, StaticRuntime(target, max_len=128)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_oracle_draft_everything_accepted(arch, shape):
    target, rt = _setup(arch)
    ref = greedy_reference(rt, PROMPT, 40)
    out, st = SpecDecoder(rt, OracleProposer(ref, shape)).generate(PROMPT, 40)
    assert out == ref
    assert st.accepted[:-1] == [shape.num_steps] * (len(st.accepted) - 1)  # all but the clipped last round
    assert st.tau > shape.num_steps


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_random_draft_still_lossless(arch, shape):
    target, rt = _setup(arch)
    ref = greedy_reference(rt, PROMPT, 30)
    out, st = SpecDecoder(rt, RandomProposer(VOCAB, shape)).generate(PROMPT, 30)
    assert out == ref and st.tau < 1.3


@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
@needs_fastcpu
def test_prepacked_layout_lossless(shape):
    """The oneDNN prepacked layout (what calibrate() picks on an AVX-512 EPYC) keeps fp32 greedy exact."""
    from eaglewire.fastcpu.gemm import PACKED, candidate_layouts
    from eaglewire.fastcpu.runtime import FastRuntime

    if PACKED not in candidate_layouts(torch.float32):
        pytest.skip("this torch build exposes no oneDNN prepacked linear (torch.ops.mkldnn._linear_pointwise)")
    target = build_target("llama")
    rt = FastRuntime(target, max_len=128, layout=PACKED)
    ref = greedy_reference(FastRuntime(target, max_len=128, layout="nt"), PROMPT, 40)  # another kernel's greedy
    assert greedy_reference(rt, PROMPT, 40) == ref
    for proposer in (OracleProposer(ref, shape), RandomProposer(VOCAB, shape)):
        out, _ = SpecDecoder(rt, proposer).generate(PROMPT, 40)
        assert out == ref


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize(
    "shape", [CHAIN, TREE, TreeShape(num_steps=4, topk=3, num_draft_tokens=10)], ids=["chain", "tree", "wide"]
)
def test_eagle_draft_lossless(arch, shape):
    target, rt = _setup(arch)
    draft, contract = build_draft(target, taps=(1, 2, 3))
    ref = greedy_reference(rt, PROMPT, 30)
    out, st = SpecDecoder(rt, EagleProposer(draft, shape, max_len=128, contract=contract)).generate(PROMPT, 30)
    assert out == ref


def test_eos_and_max_tokens_inside_an_accepted_run():
    target, rt = _setup("llama")
    ref = greedy_reference(rt, PROMPT, 40)
    eos_tok = ref[9]  # falls inside an oracle round (rounds cover 4 tokens each)
    out, _ = SpecDecoder(rt, OracleProposer(ref, CHAIN)).generate(PROMPT, 40, eos={eos_tok})
    assert out == greedy_reference(rt, PROMPT, 40, eos={eos_tok}) and out[-1] == eos_tok
    for budget in (1, 2, 6, 11):  # budgets landing on every offset of a 4-token round
        out, _ = SpecDecoder(rt, OracleProposer(ref, CHAIN)).generate(PROMPT, budget)
        assert out == ref[:budget]


def test_tree_shape_rules():
    with pytest.raises(Exception, match="more draft tokens than the tree can hold"):
        TreeShape(num_steps=2, topk=2, num_draft_tokens=8)  # capacity 2 + 4 = 6 nodes
    with pytest.raises(Exception, match="chain"):
        TreeShape(num_steps=4, topk=1, num_draft_tokens=3)
    assert TreeShape.chain(4) == TreeShape(num_steps=4, topk=1, num_draft_tokens=5)


def test_greedy_accept_walks_the_matching_branch():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, -1, 1, 1])  # root -> {5, 6}; 6 -> {7, 8}
    path, bonus = greedy_accept(tree, [6, 0, 8, 0, 9])  # root predicts 6; node 1 (6) predicts 8; 8 -> 9
    assert path == [1, 3] and bonus == 9
    ids, pos, mask = tree.verify_inputs(root=4, n=10)
    assert pos.tolist() == [[10, 11, 11, 12, 12]]
    assert mask[0, 0, 3, 10:].tolist() == [True, False, True, True, False]  # node 2 sees root, 6, itself


def test_proposer_drafts_what_the_training_forward_predicts():
    """Engine and training agree: the chain EagleProposer drafts after prefill equals unrolling the draft
    the way TTT does (step 0 on (f_t, x_{t+1}) for every t, then its own hidden at positions P, P+1)."""
    target, rt = _setup("llama")
    draft, contract = build_draft(target, taps=(1, 2, 3), seed=5)
    P = PROMPT.shape[1]
    logits, taps = rt.forward(PROMPT, torch.arange(P)[None], 0, taps=contract.taps)
    x = int(logits[0, -1].argmax())
    prop = EagleProposer(draft, CHAIN, max_len=64, contract=contract)
    prop.start(PROMPT, taps, x)
    drafted = prop.propose().tokens
    with torch.no_grad():
        ids = torch.cat([PROMPT[:, 1:], torch.tensor([[x]])], 1)
        out = draft(ids, taps)  # step 0 over every position
        expect, hidden, past = [], out.hidden[:, -1:], out.kv
        tok = int(draft.to_target_ids(out.logits[0, -1].argmax()))
        for k in range(1, CHAIN.num_steps):
            expect.append(tok)
            nxt = draft.step(torch.tensor([[tok]]), hidden, torch.tensor([[P - 1 + k]]), None, past)
            hidden, past = nxt.hidden, nxt.kv
            tok = int(draft.to_target_ids(nxt.logits[0, -1].argmax()))
        expect.append(tok)
    assert drafted == expect


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe", "nested_kimi_like"])
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_hf_fallback_runtime_lossless(arch, shape):
    from eaglewire.decoding.hf_runtime import HFRuntime
    from eaglewire.decoding.runtime import plain_runtime

    target = build_target(arch)
    rt = plain_runtime(target, 128)
    assert isinstance(rt, HFRuntime)
    hf = getattr(target.model, "language_model", target.model)  # the wrapper has no generate(); its LM does
    with torch.no_grad():  # plain HF greedy as the reference
        ref = hf.generate(
            input_ids=PROMPT,
            attention_mask=torch.ones_like(PROMPT),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, PROMPT.shape[1] :].tolist()
    out, _ = SpecDecoder(rt, OracleProposer(ref, shape)).generate(PROMPT, 20)
    assert out == ref
    out, _ = SpecDecoder(plain_runtime(target, 128), RandomProposer(VOCAB, shape)).generate(PROMPT, 20)
    assert out == ref
    draft, contract = build_draft(target, taps=(1, 2, 3))
    out, _ = SpecDecoder(plain_runtime(target, 128), EagleProposer(draft, shape, 128, contract=contract)).generate(
        PROMPT, 20
    )
    assert out == ref


def test_cli_tree_knob_defaults():
    from eaglewire.decoding.tree import DEFAULT_TREE as TREE

    tree_shape = TreeShape.from_knobs

    assert tree_shape(None, None, None, None) == TREE
    assert tree_shape(4, 1, None, None) == TreeShape(num_steps=4, topk=1, num_draft_tokens=5)  # a chain: N = S+1
    assert tree_shape(None, None, None, 3) == TreeShape.chain(3)


@pytest.mark.parametrize(
    "arch,block,shape",
    [
        ("llama", dict(block_size=4), None),
        ("qwen3", dict(block_size=4), None),
        ("llama", dict(block_size=6), TreeShape.chain(2)),
        ("qwen3", dict(block_size=3, anchor_layout="anchor_first"), None),
        ("llama", dict(block_size=4, sliding_layers=(1,), sliding_window=5), None),
        ("qwen3", dict(block_size=4, vocab_every=3), None),
    ],
    ids=["b4-llama", "b4-qwen3", "b6-k2", "anchor-first", "sliding", "reduced-vocab"],
)
def test_dflash_draft_lossless(arch, block, shape):
    """A block drafter (one non-causal pass over [anchor, MASK...] proposes a chain) keeps greedy output."""
    target, rt = _setup(arch)
    draft, contract = build_dflash(target, **block)
    ref = greedy_reference(rt, PROMPT, 30)
    prop = BlockProposer(draft, contract, shape, max_len=128)
    out, st = SpecDecoder(rt, prop).generate(PROMPT, 30)
    assert out == ref
    assert prop.k == (shape.num_steps if shape else contract.block.drafts_per_round)
    # the context holds every emitted position but the pending last token (a run that ends at the budget
    # after a round with nothing accepted; random drafts are rejected)
    assert st.accepted[-1] == 0 and prop.cache.n == PROMPT.shape[1] + len(out) - 1


@pytest.mark.parametrize("vocab_every", [None, 2], ids=["full-vocab", "reduced-vocab"])
def test_block_proposer_drafts_what_the_training_forward_predicts(vocab_every):
    """Engine and training agree: after prefill, and after a round's accept, the block proposer's drafts are
    the training forward's argmax over the slots after the anchor (a reduced vocabulary's mapped to target ids:
    i + d2t[i]), its context every verified position."""
    target, rt = _setup("llama")
    draft, contract = build_dflash(target, block_size=5, seed=3, vocab_every=vocab_every)
    ref = greedy_reference(rt, PROMPT, 8)
    P, B, mask_id = PROMPT.shape[1], 5, VOCAB - 1
    seq = torch.cat([PROMPT, torch.tensor([ref[:4]])], 1)
    _, taps = StaticRuntime(target, max_len=64).forward(seq, torch.arange(seq.shape[1])[None], 0, taps=contract.taps)

    def expected(n: int, anchor: int) -> list[int]:  # context = positions 0..n-1, block at n..n+B-1
        ids = torch.tensor([[anchor] + [mask_id] * (B - 1)])
        with torch.no_grad():
            h = draft(
                taps[:, :n],
                torch.arange(n)[None],
                ids,
                torch.arange(n, n + B)[None],
                torch.ones(1, B, n + B, dtype=torch.bool),
            )
        drafted = draft.logits(h[0, 1:]).argmax(-1)  # [B-1] ids of the draft's vocabulary
        return (drafted * vocab_every if vocab_every else drafted).tolist()  # kept ids 0, k, 2k, ...

    prop = BlockProposer(draft, contract, None, max_len=64)
    prop.start(PROMPT, taps[:, :P], ref[0])
    assert prop.propose().tokens == expected(P, ref[0])
    prop.accept(taps[:, P : P + 3], ref[1:4])  # the anchor and two accepted drafts verified; ref[3] the bonus
    assert prop.propose().tokens == expected(P + 3, ref[3])
