"""The benchmark's words in the run report: its table, its verdict (our best draft row against vanilla, and the
peer engines' rows with the same draft beside it), and τ before -> after training."""

from __future__ import annotations

from typing import Any

from eaglewire.families import get_family


def bench_rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The report's benchmark table: each row's speed, its ratio to every plain row run, τ and losslessness."""
    from eaglewire.serve.bench_summary import label

    bases = [
        b
        for b in ("vanilla", "prompt_lookup", "hf_generate", "vllm_vanilla", "llamacpp_vanilla")
        if b in res["methods"]
    ]
    head = (
        ["method", "median tok/s"] + [f"× {b}" for b in bases] + ["τ (bench)", "per-position acceptance", "= vanilla"]
    )
    rows = []
    for name, m in res["methods"].items():
        rows.append(
            [label(name, res), f"{m['median_tok_s']:.2f}"]
            + [f"{m[f'speedup_vs_{b}']:.2f}×" for b in bases]
            + [
                f"{m['tau']:.2f}" if "tau" in m else "–",
                ", ".join(f"{p:.2f}" for p in m.get("per_position", [])) or "–",
                f"{m['matches_vanilla']}/{res['prompts']}",
            ]
        )
    return head, rows


def tau_change(res: dict[str, Any]) -> str:
    """'Training started from X: τ 1.97 -> 2.01 ...' (bench.tau_prompts), or '' where it was not measured."""
    t = res.get("tau_before_after")
    if not t:
        return ""
    return (
        f"Training started from {t['start']}: τ (bench) {t['before']:.2f} before -> {t['after']:.2f} after "
        f"(chain k = {t['chain_k']}, the same {t['prompts']} prompts × {t['max_new_tokens']} new tokens, "
        "float32 drafts on the plain runtime)."
    )


def verdict(res: dict[str, Any], family: str = "eagle3") -> str:
    from eaglewire.serve.bench import family_rows
    from eaglewire.serve.bench_summary import label
    from eaglewire.serve.llamacpp_peer import LLAMACPP_METHODS
    from eaglewire.serve.peer import PEER_METHODS

    m = res["methods"]
    engines = PEER_METHODS + LLAMACPP_METHODS  # another engine's rows: quoted beside ours, never as our best
    best = max((n for n in m if n in family_rows()[family] and n not in engines), key=lambda n: m[n]["median_tok_s"])
    r = m[best]["speedup_vs_vanilla"]
    word = "faster" if r > 1 else "slower"
    return (
        f"Best {get_family(family).title} setting: {label(best, res)} at {m[best]['median_tok_s']:.2f} tok/s = {r:.2f}× the "
        f"tokens/s of vanilla decoding ({word}), τ (bench) {m[best]['tau']:.2f}"
        + (f", {m[best]['speedup_vs_prompt_lookup']:.2f}× prompt lookup" if "prompt_lookup" in m else "")
        + "."
        + (
            f" The real vLLM CPU build with the same draft: {label('vllm_eagle_chain', res)} "
            f"{m['vllm_eagle_chain']['median_tok_s']:.2f} tok/s ({m['vllm_eagle_chain']['speedup_vs_vllm_vanilla']:.2f}× "
            f"its vanilla, τ {m['vllm_eagle_chain']['tau']:.2f}); ours is "
            f"{m[best]['speedup_vs_vllm_vanilla'] / m['vllm_eagle_chain']['speedup_vs_vllm_vanilla']:.2f}× its tok/s."
            if "vllm_eagle_chain" in m and "vllm_vanilla" in m
            else ""
        )
        + _llamacpp_words(res)
        + (" " + tau_change(res) if tau_change(res) else "")
    )


def _llamacpp_words(res: dict[str, Any]) -> str:
    """llama.cpp's measured tau and speed with the draft, against llama.cpp alone ('' without its rows)."""
    from eaglewire.serve.bench_summary import label

    m = res["methods"]
    if "llamacpp_eagle_chain" not in m or "llamacpp_vanilla" not in m:
        return ""
    r = m["llamacpp_eagle_chain"]
    same = (
        f"; {r['matches_llamacpp_vanilla']}/{len(r['tok_s'])} answers equal its own plain ones"
        if "matches_llamacpp_vanilla" in r
        else ""
    )
    return (
        f" llama.cpp with the same draft, {label('llamacpp_eagle_chain', res)}: τ {r['tau']:.2f}, "
        f"{r['median_tok_s']:.2f} tok/s = {r['speedup_vs_llamacpp_vanilla']:.2f}× llama.cpp alone "
        f"({m['llamacpp_vanilla']['median_tok_s']:.2f} tok/s){same}."
    )
