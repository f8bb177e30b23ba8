"""Benchmark: HF generate, our vanilla loop, HF prompt lookup, EAGLE-3 chain and tree — same prompts,
same chat template, same max new tokens, greedy — interleaved in ONE process (the method order rotates
per prompt, so machine noise hits every method alike). A warm-up prompt runs every method first and is
not counted. Reported per method: median tokens/s over prompts, speedup vs HF generate (ratio of
medians), tau and per-position acceptance for EAGLE, and whether the tokens equal our vanilla loop.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from eaglewire.spec.engine import SpecDecoder, SpecStats, greedy_reference
from eaglewire.spec.propose import EagleProposer
from eaglewire.spec.hf_runtime import make_runtime
from eaglewire.spec.tree import TreeShape

METHODS = ("hf_generate", "vanilla", "prompt_lookup", "eagle_chain", "eagle_tree")


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: SpecStats | None = None


def _hf(target: Any, ids: torch.Tensor, max_new: int, eos: int, **kw: Any) -> Run:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                    do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=eos,
                                    pad_token_id=eos, **kw)
    return Run(out[0, ids.shape[1]:].tolist(), time.perf_counter() - t0)


def make_methods(target: Any, draft: Any, chain: TreeShape, tree: TreeShape, max_len: int,
                 eos: int) -> dict[str, Callable[[torch.Tensor, int], Run]]:
    rt = make_runtime(target, max_len, calibrate=True)  # one cache, reused by every method on our runtime

    def vanilla(ids: torch.Tensor, n: int) -> Run:
        t0 = time.perf_counter()
        toks = greedy_reference(rt, ids, n, eos={eos})
        return Run(toks, time.perf_counter() - t0)

    def eagle(shape: TreeShape) -> Callable[[torch.Tensor, int], Run]:
        prop = EagleProposer(draft, draft.contract, shape, max_len)

        def run(ids: torch.Tensor, n: int) -> Run:
            toks, st = SpecDecoder(rt, prop).generate(ids, n, eos={eos})
            return Run(toks, st.total_s, st)
        return run

    return {"hf_generate": lambda ids, n: _hf(target, ids, n, eos),
            "vanilla": vanilla,
            "prompt_lookup": lambda ids, n: _hf(target, ids, n, eos, prompt_lookup_num_tokens=10),
            "eagle_chain": eagle(chain), "eagle_tree": eagle(tree)}


def run_bench(target: Any, draft: Any, prompts: list[torch.Tensor], max_new: int, chain: TreeShape,
              tree: TreeShape, log: Callable[[str], None] = print) -> dict:
    eos = target.tokenizer.eos_token_id
    max_len = max(p.shape[1] for p in prompts) + max_new + tree.num_draft_tokens + 16
    methods = make_methods(target, draft, chain, tree, max_len, eos)
    for name, fn in methods.items():  # warm-up, not counted
        fn(prompts[0], min(16, max_new))
    runs: dict[str, list[Run]] = {m: [] for m in methods}
    names = list(methods)
    for i, ids in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            runs[name].append(methods[name](ids, max_new))
        log(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{m} {len(runs[m][-1].tokens) / runs[m][-1].seconds:.1f}" for m in names) + " tok/s")
    return summarize(runs, chain, tree, max_new)


def summarize(runs: dict[str, list[Run]], chain: TreeShape, tree: TreeShape, max_new: int) -> dict:
    ref = [r.tokens for r in runs["vanilla"]]
    out: dict[str, Any] = {"max_new_tokens": max_new, "prompts": len(ref),
                           "chain": chain.__dict__, "tree": tree.__dict__, "methods": {}}
    base = None
    for name, rs in runs.items():
        rates = [len(r.tokens) / r.seconds for r in rs]
        m: dict[str, Any] = {"median_tok_s": statistics.median(rates), "tok_s": rates,
                             "matches_vanilla": sum(r.tokens == t for r, t in zip(rs, ref))}
        if rs[0].stats is not None:
            acc = [a for r in rs for a in r.stats.accepted]
            depth = (chain if name == "eagle_chain" else tree).num_steps
            m["tau"] = (sum(acc) + len(acc)) / len(acc)
            m["per_position"] = [sum(a > i for a in acc) / len(acc) for i in range(depth)]
            m["draft_s"] = sum(r.stats.draft_s for r in rs)
            m["verify_s"] = sum(r.stats.verify_s for r in rs)
            m["total_s"] = sum(r.seconds for r in rs)
        out["methods"][name] = m
        base = base or (m["median_tok_s"] if name == "hf_generate" else None)
    for m in out["methods"].values():
        m["speedup_vs_hf_generate"] = m["median_tok_s"] / base
    return out


def markdown(result: dict) -> str:
    lines = ["| method | median tok/s | speedup vs HF generate | τ | per-position acceptance | same tokens as vanilla |",
             "|---|---|---|---|---|---|"]
    for name, m in result["methods"].items():
        tau = f"{m['tau']:.2f}" if "tau" in m else "–"
        pp = ", ".join(f"{p:.2f}" for p in m.get("per_position", [])) or "–"
        lines.append(f"| {name} | {m['median_tok_s']:.2f} | {m['speedup_vs_hf_generate']:.2f}× | {tau} | {pp} | "
                     f"{m['matches_vanilla']}/{result['prompts']} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("eagle_chain", "eagle_tree"):
        pp = result["methods"][name].get("per_position", [])
        a.plot(range(1, len(pp) + 1), pp, "o-", label=name)
    a.set(xlabel="draft position", ylabel="accepted at this depth / verify steps", ylim=(0, 1),
          title="per-position acceptance")
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
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    (out / "bench.md").write_text(markdown(result))
    plot(result, out / "bench.png")
