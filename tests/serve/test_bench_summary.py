"""The bench's summary arithmetic: speedups and where a speculative round's time goes."""

import pytest

from eaglewire.serve.bench_summary import Run, markdown, summarize
from eaglewire.decoding.engine import SpecStats
from eaglewire.decoding.tree import TreeShape


def _spec(tokens: list[int], seconds: float, accepted: list[int], draft_s: float, verify_s: float) -> Run:
    return Run(
        tokens,
        seconds,
        SpecStats(
            verify_steps=len(accepted),
            accepted=accepted,
            new_tokens=len(tokens),
            draft_s=draft_s,
            verify_s=verify_s,
            total_s=seconds,
        ),
    )


def test_round_cost_is_tau_over_speed_against_the_same_engines_vanilla():
    toks = list(range(12))
    # vanilla 12 tokens in 0.6 s: 20 tok/s, a 50 ms step. EAGLE: 6 rounds (tau 2) in 0.4 s: 30 tok/s, so a
    # round is 2 / 30 s = 66.7 ms = 1.333 decode steps; 0.1 s draft + 0.3 s verify over 6 rounds.
    runs = {
        "vanilla": [Run(toks, 0.6)],
        "eagle_chain": [_spec(toks, 0.4, [1] * 6, 0.1, 0.3)],
        # vLLM's rows: vanilla 40 tok/s, EAGLE 48 tok/s at tau 1.5 -> round = 1.5 / 48 * 40 = 1.25 steps
        "vllm_vanilla": [Run(toks, 0.3)],
        "vllm_eagle_chain": [Run(toks, 0.25)],
    }
    out = summarize(runs, TreeShape.chain(3), TreeShape.chain(3), 12, {"vllm_eagle_chain": {"tau": 1.5}})
    m, v = out["methods"]["eagle_chain"], out["methods"]["vllm_eagle_chain"]
    assert m["tau"] == pytest.approx(2.0)
    assert m["round_vs_decode_step"] == pytest.approx(4 / 3)
    assert m["decode_step_ms"] == pytest.approx(50.0)
    assert (m["draft_ms_per_round"], m["verify_ms_per_round"]) == (pytest.approx(100 / 6), pytest.approx(50.0))
    assert v["round_vs_decode_step"] == pytest.approx(1.25)
    assert v["decode_step_ms"] == pytest.approx(25.0)
    assert "round_vs_decode_step" not in out["methods"]["vanilla"]
    out["dtype"] = "float32"
    text = markdown(out)
    assert "one round / one decode step (50.0 ms) = 1.33: draft 16.7 + verify 50.0 ms per round" in text
    assert "vllm_eagle_chain (k=3): one round / one decode step (25.0 ms) = 1.25" in text


def test_each_repetition_compares_the_engines_on_the_same_prompts():
    """A repetition's ours / peer: the ratio of the medians, and the median of the per-prompt ratios (one
    prompt in both engines); markdown lists every repetition."""
    from eaglewire.serve.bench_summary import repeat_summary as _repeat_summary

    toks = list(range(10))
    runs = {
        "eagle_chain": [Run(toks, s) for s in (0.1, 0.2, 0.4)],  # 100, 50, 25 tok/s
        "vllm_eagle_chain": [Run(toks, s) for s in (0.2, 0.1, 0.4)],  # 50, 100, 25 tok/s
        "vanilla": [Run(toks, 0.5)] * 3,
    }
    rep = _repeat_summary(runs)
    assert rep["median_tok_s"]["eagle_chain"] == pytest.approx(50.0)
    assert rep["eagle_chain_vs_vllm_eagle_chain"] == pytest.approx(1.0)  # medians 50 / 50
    assert rep["eagle_chain_vs_vllm_eagle_chain_per_prompt"] == pytest.approx(1.0)  # median of 2, 0.5, 1
    assert "vanilla_vs_vllm_vanilla" not in rep  # no peer vanilla row
    out = summarize(runs, TreeShape.chain(3), TreeShape.chain(3), 10)
    out.update(
        dtype="float32", prompts=3, repetitions=2, repeats=[rep, {**rep, "eagle_chain_vs_vllm_eagle_chain": 1.5}]
    )
    text = markdown(out)
    assert "repetition 1: eagle_chain (k=3) / vllm_eagle_chain (k=3) 1.00× (per prompt 1.00×)" in text
    assert "repetition 2: eagle_chain (k=3) / vllm_eagle_chain (k=3) 1.50×" in text
