"""What the benchmark's runs add up to: per row the median tokens/s, speedups against the plain rows, tau and
per-position acceptance, where a speculative round's time goes, each repetition's ours / peer ratios; and the
result written out: bench.json, bench.md (the table) and bench.png (the picture)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewire.decoding.engine import SpecStats
from eaglewire.decoding.tree import TreeShape
from eaglewire.safeio import atomic_write_text
from eaglewire.serve.bench_rows import BASES, BLOCK_METHODS, PEER_BASES, PEER_PAIRS


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: SpecStats | None = None


def repeat_summary(runs: dict[str, list[Run]]) -> dict:
    """One repetition: median tok/s per method and ours / peer per pair present (ratio of the medians, and
    the median of the per-prompt ratios: the same prompt in both engines)."""
    rates = {m: [len(r.tokens) / r.seconds for r in rs] for m, rs in runs.items() if rs}
    out: dict[str, Any] = {"median_tok_s": {m: statistics.median(v) for m, v in rates.items()}}
    for a, b in PEER_PAIRS:
        if a in rates and b in rates:
            out[f"{a}_vs_{b}"] = statistics.median(rates[a]) / statistics.median(rates[b])
            out[f"{a}_vs_{b}_per_prompt"] = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
    return out


def summarize(
    runs: dict[str, list[Run]],
    chain: TreeShape,
    tree: TreeShape,
    max_new: int,
    reported: dict[str, dict] | None = None,
    block: TreeShape | None = None,
) -> dict:
    """`reported`: tau / per-position counted by an engine itself (the vLLM rows), by method; `block`: the
    chain the block-drafter rows verify."""
    from eaglewire.hw import describe_cpu

    ref = [r.tokens for r in runs["vanilla"]]
    out: dict[str, Any] = {
        "max_new_tokens": max_new,
        "prompts": len(ref),
        "cpu": describe_cpu(),
        "chain": chain.__dict__,
        "tree": tree.__dict__,
        "methods": {},
    }
    if block is not None:
        out["block"] = block.__dict__
    depth = {"eagle_chain": chain.num_steps, **{m: block.num_steps for m in BLOCK_METHODS if block is not None}}
    base = None
    for name, rs in runs.items():
        rates = [len(r.tokens) / r.seconds for r in rs]
        m: dict[str, Any] = {
            "median_tok_s": statistics.median(rates),
            "tok_s": rates,
            "matches_vanilla": sum(r.tokens == t for r, t in zip(rs, ref)),
        }
        if rs[0].stats is not None:
            pooled = SpecStats(accepted=[a for r in rs for a in r.stats.accepted])  # every prompt's verify steps
            m["tau"] = pooled.tau
            m["per_position"] = pooled.per_position(depth.get(name, tree.num_steps))
            m["draft_s"] = sum(r.stats.draft_s for r in rs)
            m["verify_s"] = sum(r.stats.verify_s for r in rs)
            m["total_s"] = sum(r.seconds for r in rs)
            m["draft_ms_per_round"] = m["draft_s"] / len(pooled.accepted) * 1e3
            m["verify_ms_per_round"] = m["verify_s"] / len(pooled.accepted) * 1e3
        m.update((reported or {}).get(name, {}))
        out["methods"][name] = m
    for base in BASES:  # ratios of medians measured in this run
        if base in out["methods"]:
            for m in out["methods"].values():
                m[f"speedup_vs_{base}"] = m["median_tok_s"] / out["methods"][base]["median_tok_s"]
    _round_costs(out["methods"])
    return out


def _round_costs(methods: dict[str, dict]) -> None:
    """Where a speculative method's time goes: one round (draft + verify) / one decode step of the same
    engine = (tau / its tok/s) / (1 / that engine's vanilla tok/s), from medians. Above 1 a round costs more
    than the step it replaces, so tau must exceed it for any speedup; ours against vanilla, a peer engine's
    against its own plain row (vllm_vanilla, llamacpp_vanilla)."""
    for name, m in methods.items():
        base = methods.get(next((b for p, b in PEER_BASES.items() if name.startswith(p)), "vanilla"))
        if "tau" in m and base:
            m["round_vs_decode_step"] = m["tau"] / m["median_tok_s"] * base["median_tok_s"]
            m["decode_step_ms"] = 1e3 / base["median_tok_s"]


def label(name: str, result: dict) -> str:
    """'eagle_tree (S=4, K=2, N=6)' etc.: the knobs belong next to the numbers."""
    c, t = result["chain"], result["tree"]
    gguf = result["methods"].get("llamacpp_eagle_chain", {}).get("gguf", {})
    knobs = {
        "eagle_chain": f" (k={c['num_steps']})",
        "vllm_eagle_chain": f" (k={c['num_steps']})",
        "llamacpp_eagle_chain": f" (k={c['num_steps']}, {gguf.get('target')} target, {gguf.get('draft')} draft)",
        "eagle_tree": f" (S={t['num_steps']}, K={t['topk']}, N={t['num_draft_tokens']})",
        **{m: f" (k={result['block']['num_steps']} per block)" for m in BLOCK_METHODS if "block" in result},
    }
    return name + knobs.get(name, "")


def markdown(result: dict) -> str:
    bases = [b for b in BASES if b in result["methods"]]
    lines = [
        "| method | median tok/s | "
        + " | ".join(f"speedup vs {b}" for b in bases)
        + " | τ | per-position acceptance | same tokens as vanilla |",
        "|---|---|" + "---|" * len(bases) + "---|---|---|",
    ]
    for name, m in result["methods"].items():
        tau = f"{m['tau']:.2f}" if "tau" in m else "–"
        pp = ", ".join(f"{p:.2f}" for p in m.get("per_position", [])) or "–"
        ratios = " | ".join(f"{m[f'speedup_vs_{b}']:.2f}×" for b in bases)
        lines.append(
            f"| {label(name, result)} | {m['median_tok_s']:.2f} | {ratios} | {tau} | {pp} | "
            f"{m['matches_vanilla']}/{result['prompts'] * result.get('repetitions', 1)} |"
        )
    for name, m in result["methods"].items():
        if "round_vs_decode_step" in m:
            split = (
                f": draft {m['draft_ms_per_round']:.1f} + verify {m['verify_ms_per_round']:.1f} ms per round"
                if "draft_ms_per_round" in m
                else ""
            )
            lines.append(
                f"\n{label(name, result)}: one round / one decode step ({m['decode_step_ms']:.1f} ms) "
                f"= {m['round_vs_decode_step']:.2f}{split}"
            )
    for name, m in result["methods"].items():
        if "matches_llamacpp_vanilla" in m:  # llama.cpp's losslessness: against its own plain answers
            lines.append(
                f"\n{label(name, result)}: {m['matches_llamacpp_vanilla']}/{len(m['tok_s'])} answers equal "
                "llamacpp_vanilla's"
            )
    cpu = result.get("cpu")
    if cpu:
        ddt = result.get("draft_dtype", result["dtype"])
        drafted = f" (our EAGLE rows' draft: {ddt})" if ddt != result["dtype"] else ""
        reps = f" x {result['repetitions']} repetitions" if result.get("repetitions", 1) > 1 else ""
        lines.append(
            f"\n{result['prompts']} prompts{reps}, {result['max_new_tokens']} new tokens, greedy, {result['dtype']}{drafted}; "
            f"CPU: {cpu['model']}, "
            f"{cpu['threads']} threads, native bf16 {'yes' if cpu['native_bf16'] else 'no'}"
        )
    for r, rep in enumerate(result.get("repeats", [])):
        pairs = "; ".join(
            f"{label(a, result)} / {label(b, result)} {rep[f'{a}_vs_{b}']:.2f}× (per prompt "
            f"{rep[f'{a}_vs_{b}_per_prompt']:.2f}×)"
            for a, b in PEER_PAIRS
            if f"{a}_vs_{b}" in rep
        )
        lines.append(f"{'' if r else chr(10)}repetition {r + 1}: {pairs or 'no peer rows'}")
    if result["dtype"] == "bfloat16":
        lines.append(
            "bfloat16: 'same tokens as vanilla' can fall short of all without a loss: a verify of k rows "
            "rounds unlike a 1-row step, and where two tokens tie in bf16 the runs may take different ones."
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("eagle_chain", "eagle_tree", "vllm_eagle_chain", "llamacpp_eagle_chain", *BLOCK_METHODS):
        pp = result["methods"].get(name, {}).get("per_position", [])
        if pp:
            a.plot(range(1, len(pp) + 1), pp, "o-", label=label(name, result))
    a.set(
        xlabel="draft position",
        ylabel="accepted at this depth / verify steps",
        ylim=(0, 1),
        title="per-position acceptance",
    )
    a.legend()
    names = list(result["methods"])
    b.bar(names, [result["methods"][n]["median_tok_s"] for n in names])
    b.set(ylabel="median tokens/s", title=f"{result['prompts']} prompts, {result['max_new_tokens']} new tokens")
    b.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.json", json.dumps(result, indent=2))
    atomic_write_text(out / "bench.md", markdown(result))
    plot(result, out / "bench.png")
