"""Real llama.cpp serves a DFlash draft that accepts, and accepts what our engine accepts on the same prompts.

A random draft accepts nothing, so nothing about acceptance can be compared with one (test_llamacpp_serve.py
checks that such a file loads and serves losslessly). Here the target is tiny (llamacpp_gguf.tiny_target: 8
layers, 64 wide, SmolLM2's vocabulary so llama.cpp's converter and tokenizer take it), made sharp (layers that
write strongly, a peaked head, as tests/doctor/test_measured_block.py does) and converted to an f32 GGUF by
llama.cpp's own converter; a one-layer DFlash draft is trained on it for seconds (random tokens, every position
supervised), exported by `export --format llamacpp`, and served by llama-server (`--spec-type draft-dflash`) on
prompts of random tokens. Greedy output equals llama.cpp's plain output; τ and per-position acceptance equal
our engine's (BlockProposer, same draft, same prompt ids) within two fp32 kernels' tolerance.

llama.cpp's DFlash rules this holds (common/speculative.cpp, read in tests/export/test_llamacpp_rules.py): the
block drafted is [id_last, MASK x n_max] at positions pos0..pos0+n_max, the context the target's layer INPUTS at
target_layers for every verified position (prompt, anchor, accepted drafts), drafts the argmax at slots 1..n_max.
"""

from __future__ import annotations

import pytest
import torch
from llamacpp_gguf import need_converter, need_llama_server, tiny_target

need_llama_server()

L, TAPS, BLOCK, MAX_NEW, PROMPTS = 8, (2, 5, 7), 4, 32, 6
TAU_TOL, FIRST_TOL = 0.15, 0.1  # as for EAGLE-3 (test_llamacpp_server.py): two fp32 kernels, argmax near-ties


def _samples(n, seed, T=24):
    from eaglewire.data.samples import Sample

    g = torch.Generator().manual_seed(seed)
    return [
        Sample(
            id=f"r{i}", input_ids=torch.randint(0, 256, (T,), generator=g), loss_mask=torch.ones(T, dtype=torch.long)
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(target, its f32 GGUF, the trained draft, the draft's GGUF, prompts)."""
    from eaglewire.capture.features import OnlineFeatures
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.convert import export_draft
    from eaglewire.families import BlockWiring
    from eaglewire.serve.llamacpp import convert_hf
    from eaglewire.train.loop import TrainConfig, train

    need_converter()
    root = tmp_path_factory.mktemp("dflash-accept")
    target = tiny_target(root / "target", layers=L)
    with torch.no_grad():  # a sharp target: its states carry its next token, which a draft can learn in seconds
        for layer in target.layers:
            layer.self_attn.o_proj.weight.mul_(16)
            layer.mlp.down_proj.weight.mul_(16)
        target.model.lm_head.weight.mul_(30)
    target.model.save_pretrained(root / "target")
    model_gguf = convert_hf(root / "target", root / "target.gguf", "f32")
    contract = dflash_contract(target, TAPS, BlockWiring(block_size=BLOCK, mask_token_id=255), None)
    c = TrainConfig(
        family="dflash",
        block_size=BLOCK,
        anchors=8,
        max_steps=400,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        eval_every=10_000,
        ckpt_every=10_000,
        num_layers=1,
        loss="forward_kl",
        supervise="all",
    )
    samples = _samples(600, 0)
    train(
        target,
        contract,
        None,
        OnlineFeatures(target, contract, pad_id=0),
        samples[:-8],
        samples[-8:],
        c,
        root / "train",
    )
    draft = load_checkpoint(root / "train" / "draft", target=target)
    gguf = export_draft(draft, draft.contract, root / "llamacpp", "llamacpp", vocab_from=model_gguf) / "draft.gguf"
    prompts = [s.input_ids[None] for s in _samples(PROMPTS, 1, T=16)]
    return target, model_gguf, draft, gguf, prompts


def _ours(target, draft, prompts, k):
    """Our engine at k drafts per round: (greedy ids per prompt, tau, per-position acceptance)."""
    from eaglewire.decoding.block import BlockProposer
    from eaglewire.decoding.engine import SpecDecoder, SpecStats
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape

    max_len = max(p.shape[1] for p in prompts) + MAX_NEW + 16
    rt, ids, accepted = plain_runtime(target, max_len), [], []
    for p in prompts:
        toks, st = SpecDecoder(rt, BlockProposer(draft, draft.contract, TreeShape.chain(k), max_len)).generate(
            p, MAX_NEW
        )
        ids.append(toks)
        accepted += st.accepted
    st = SpecStats(accepted=accepted)
    return ids, st.tau, st.per_position(k)


def _served(model_gguf, gguf, prompts, k):
    """llama-server: (greedy ids per prompt, its speculative counters)."""
    from eaglewire.serve.llamacpp import LlamaServer

    with LlamaServer(
        model_gguf, gguf, spec_type="draft-dflash", n_max=k, threads=1, extra_args=["--ignore-eos"]
    ) as srv:
        out = [srv.complete(p[0].tolist(), MAX_NEW) for p in prompts]
        return [c.tokens for c in out], srv.counters()


def test_llamacpp_serves_our_dflash_draft_with_our_acceptance(setup):
    target, model_gguf, draft, gguf, prompts = setup
    k = BLOCK - 1  # the line export prints: the whole block
    ours_ids, tau, per_pos = _ours(target, draft, prompts, k)
    ids, c = _served(model_gguf, gguf, prompts, k)
    print(
        f"\nDFlash k={k}: llama.cpp tau {c.tau:.3f} per position {c.per_position}; ours tau {tau:.3f} "
        f"per position {per_pos}"
    )
    assert sum(a == b for a, b in zip(ids, ours_ids)) >= PROMPTS - 1  # the same greedy text (fp32 both)
    # a draft that accepts (measured under load: tau 1.50, first position 0.18; the tiny target's greedy text
    # repeats, so a round accepts all or nothing): the comparison means something
    assert tau > 1.2 and per_pos[0] > 0.1, (tau, per_pos)
    assert c.drafts > 0 and c.k == k
    assert abs(c.tau - tau) < TAU_TOL and abs(c.per_position[0] - per_pos[0]) < FIRST_TOL, (c.to_dict(), per_pos)
