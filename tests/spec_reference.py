"""Our engine's acceptance on a few prompts: what a real engine (vLLM, llama.cpp) serving the same draft must
measure. Shared by tests/vllm_client/test_vllm_client.py and tests/serve/test_llamacpp_server.py."""

from __future__ import annotations

from typing import Any


def our_acceptance(
    target: Any, draft: Any, prompts: list[Any], max_new: int, k: int, vanilla: list[list[int]] | None = None
) -> tuple[list[list[int]], float, list[float]]:
    """Our engine's (vanilla greedy ids, tau, per-position acceptance) of `draft` as a k-token chain on the
    prompts, its output checked equal to the target's plain greedy decode. `vanilla`: that decode, from an
    earlier call on the same target, prompts and max_new (it depends on neither the draft nor the call: fp32,
    the same plain runtime), so a module decodes it once instead of once per draft."""
    from eaglewire.decoding.engine import SpecDecoder, SpecStats, greedy_reference
    from eaglewire.decoding.propose import EagleProposer
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape

    eos = {target.tokenizer.eos_token_id}
    max_len = max(p.shape[1] for p in prompts) + max_new + k + 16
    rt = plain_runtime(target, max_len)
    prop = EagleProposer(draft, TreeShape.chain(k), max_len)
    if vanilla is None:
        vanilla = [greedy_reference(rt, p, max_new, eos=eos) for p in prompts]
    accepted = []
    for p, plain in zip(prompts, vanilla, strict=True):
        toks, st = SpecDecoder(rt, prop).generate(p, max_new, eos=eos)
        assert toks == plain
        accepted += st.accepted
    st = SpecStats(accepted=accepted)
    return vanilla, st.tau, st.per_position(k)
