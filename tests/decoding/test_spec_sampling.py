"""Rejection sampling preserves the target distribution (statistical tests)."""

import torch
from proposers import OracleProposer, RandomProposer
from tiny import VOCAB, build_dflash, build_target

from eaglewire.decoding.block import BlockProposer
from eaglewire.decoding.engine import SpecDecoder
from eaglewire.decoding.runtime import StaticRuntime
from eaglewire.decoding.tree import DraftTree, TreeShape, sample_accept, target_probs


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def test_sample_accept_emits_exact_target_samples():
    V = 6
    p_root = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15, 0.0])
    p_child = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    probs = torch.stack([p_root, p_child, p_child, p_child])
    tree = DraftTree(tokens=[3, 1, 2], parents=[-1, -1, 0])  # root -> {3, 1}; 3 -> {2}
    gen = torch.Generator().manual_seed(0)
    first, second = torch.zeros(V), torch.zeros(V)
    n = 20000
    for _ in range(n):
        path, bonus = sample_accept(tree, probs, gen)
        emitted = [tree.tokens[i] for i in path] + [bonus]
        first[emitted[0]] += 1
        if emitted[0] == 3:
            second[emitted[1]] += 1
    assert _tv(first, p_root) < 0.015  # ~3.5 sigma for n=20000
    assert _tv(second, p_child) < 0.03
    assert first[5] == 0  # a zero-probability token is never emitted


def test_top_p_keeps_the_nucleus():
    p = target_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.7)
    torch.testing.assert_close(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def _concentrated_target():
    """A tiny target whose next-token mass sits on a few tokens (so the tests have power), the prompt, the
    target's first-token top-40 and its marginal of the 2nd new token [V] and p(x2 | prompt, top-1 x1) [V]."""
    target = build_target("llama")
    with torch.no_grad():
        target.model.lm_head.weight.mul_(8)
    prompt = torch.tensor([[5, 17, 42]])
    with torch.no_grad():
        p1 = torch.softmax(target.model(input_ids=prompt).logits[0, -1], -1)
        top = p1.topk(40).indices  # the x1 values carrying almost all the mass
        batch = torch.cat([prompt.expand(len(top), -1), top[:, None]], 1)
        p2_given = torch.softmax(target.model(input_ids=batch).logits[:, -1], -1)
        marginal = (p1[top, None] * p2_given).sum(0) / p1[top].sum()
    return target, prompt, top, marginal, p2_given[0]


def _binned_tv(counts: torch.Tensor, marginal: torch.Tensor, p2_first: torch.Tensor) -> tuple[float, float]:
    """TV to the marginal and to the unconditional p(x2 | x1 = argmax), over the marginal's 10 most likely
    tokens + "other" (the sampling-noise floor is then ~0.03 for 1500 samples, ~0.037 for 1000)."""
    bins = marginal.topk(10).indices

    def binned(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[bins], (x.sum() - x[bins].sum())[None]])

    return _tv(binned(counts), binned(marginal)), _tv(binned(counts), binned(p2_first))


def test_dflash_sampling_matches_target_marginal():
    """A block drafter's chain, verified by rejection sampling, emits the target's marginal too. For power its
    drafts must often be right: with its attention and MLP outputs zeroed, every mask slot drafts
    argmax head(norm(embed(mask))), and the mask token is the row whose draft is the marginal's likeliest."""
    from eaglewire.ops import rms_norm

    target, prompt, top, marginal, p2_first = _concentrated_target()
    with torch.no_grad():
        normed = rms_norm(target.embedding(), target.final_norm_weight(), 1e-6)  # [V, H]: each row as a mask
        drafted = (normed @ target.head_rows().T).argmax(-1)  # [V]: what each mask row would draft
    mask = int(marginal[drafted].argmax())
    draft, contract = build_dflash(target, block_size=3, layers=1, mask_token_id=mask)
    with torch.no_grad():
        for layer in draft.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    rt = StaticRuntime(target, max_len=32)
    prop = BlockProposer(draft, contract, None, max_len=32)
    counts, accepted = torch.zeros(VOCAB), 0
    n = 1000  # fewer than the EAGLE test's 1500 (a block round costs more): noise floor ~0.037
    for s in range(n):
        out, st = SpecDecoder(rt, prop).generate(prompt, 2, temperature=1.0, seed=s)
        counts[out[1]] += 1
        accepted += st.accepted[0] > 0
    tv, tv_first = _binned_tv(counts, marginal, p2_first)
    assert tv < 0.085, tv
    assert accepted > n // 40, accepted  # power: drafts are accepted (~5% of rounds)


def test_engine_sampling_matches_target_marginal():
    """The 2nd token of spec sampling (decided by verification) follows the target's marginal."""
    target, prompt, top, marginal, p2_first = _concentrated_target()
    rt = StaticRuntime(target, max_len=32)
    counts = torch.zeros(VOCAB)
    shape = TreeShape.chain(2)
    n = 1500
    for s in range(n):
        prop = RandomProposer(VOCAB, shape, seed=s) if s % 2 else OracleProposer([int(top[0]), int(top[1])], shape)
        out, _ = SpecDecoder(rt, prop).generate(prompt, 2, temperature=1.0, seed=s)
        counts[out[1]] += 1
    tv, tv_first = _binned_tv(counts, marginal, p2_first)
    assert tv < 0.07, tv
    # the test has power: the *unconditional* next-token distribution p(x2 | prompt, x1 = argmax) is far off
    assert tv_first > 0.1
