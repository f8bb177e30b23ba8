"""Benchmark: HF generate, our vanilla loop, HF prompt lookup, EAGLE-3 chain and tree — same prompts,
same chat template, same max new tokens, greedy — interleaved in ONE process (the method order rotates
per prompt, so machine noise hits every method alike). A warm-up prompt runs every method first and is
not counted. Reported per method: median tokens/s over prompts, speedup vs HF generate (ratio of
medians), tau and per-position acceptance for EAGLE, and whether the tokens equal our vanilla loop.
Optional peer rows run the real vLLM CPU build or llama.cpp's llama-server on the same prompts, interleaved with
ours (their servers paused between their requests: serve/peer.py, serve/llamacpp_peer.py).
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglewire.data.conversations import read_conversations
from eaglewire.errors import EaglewireError
from eaglewire.families import families_with, get_family, register_part
from eaglewire.decoding.engine import SpecDecoder, SpecStats, greedy_reference
from eaglewire.compose import cache_len, proposal_shape, proposer, runtime
from eaglewire.serve.llamacpp_peer import LLAMACPP_METHODS, LlamacppPeers
from eaglewire.serve.peer import PEER_METHODS, PeerServers
from eaglewire.decoding.tree import TreeShape
from eaglewire.safeio import atomic_write_text
from eaglewire.target.protocol import RunnableTarget
from eaglewire.data.template import chat_ids

METHODS = ("hf_generate", "vanilla", "prompt_lookup", "eagle_chain", "eagle_tree")  # on our runtime
# Defaults of `eaglewire bench` and of the run config's bench section (defined here only; the tree is
# decoding/tree.py's DEFAULT_TREE). A chain of 1: on a CPU a verify of 1-3 tokens costs about one decode step.
QUESTIONS, PROMPTS, MAX_NEW_TOKENS = "mtbench", 8, 128
CHAIN_K = 1
# `eaglewire run`'s bench rows by default: HF generate is opt-in there (it is the slowest row to time)
DEFAULT_METHODS = ("vanilla", "prompt_lookup", "eagle_chain", "eagle_tree")
# Rows that decode with a block drafter (`--dflash-draft`): its whole block per round (decoding/block.py)
BLOCK_METHODS = ("dflash",)
# The rows that decode with a draft, per drafter family (the name its contract carries): a run of one family
# benchmarks its own rows; vLLM's peer rows are served with the EAGLE-3 draft.
register_part("eagle3", "bench_rows", ("eagle_chain", "eagle_tree", *PEER_METHODS, *LLAMACPP_METHODS))
register_part("dflash", "bench_rows", BLOCK_METHODS)


def family_rows() -> dict[str, tuple[str, ...]]:
    """Each family's benchmark rows (its record's "bench_rows" part), by family name."""
    return {f.name: tuple(f.part("bench_rows")) for f in families_with("bench_rows")}


BASES = ("hf_generate", "vanilla", "prompt_lookup", "vllm_vanilla", "llamacpp_vanilla")  # speedups quoted against
PEER_BASES = {"vllm_": "vllm_vanilla", "llamacpp_": "llamacpp_vanilla"}  # a peer row's own engine's plain row


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: SpecStats | None = None


def _hf(target: RunnableTarget, ids: torch.Tensor, max_new: int, eos: int, **kw: Any) -> Run:
    t0 = time.perf_counter()
    ids = ids.to(target.device)  # HF generate runs where the target is
    with torch.no_grad():
        out = target.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=eos,
            **kw,
        )
    return Run(out[0, ids.shape[1] :].tolist(), time.perf_counter() - t0)


def rows_for(family: str, names: Sequence[str]) -> tuple[str, ...]:
    """`names` as a draft of `family` is benchmarked: the rows without a draft kept, the family's own rows kept
    (all of them where `names` asks for none), the rows of other families' drafts dropped."""
    rows_of = family_rows()
    own = get_family(family).part("bench_rows")
    others = {m for f, rows in rows_of.items() if f != family for m in rows} - set(own)
    keep = [m for m in names if m not in others]
    engines = PEER_METHODS + LLAMACPP_METHODS  # another engine's rows: only where asked for
    return tuple(keep if any(m in own for m in keep) else keep + [m for m in own if m not in engines])


def check_methods(names: Sequence[str]) -> None:
    """Refuse an unknown row, or a set without vanilla (every row's tokens are checked against it)."""
    known = METHODS + BLOCK_METHODS + PEER_METHODS + LLAMACPP_METHODS
    unknown = [n for n in names if n not in known]
    if unknown or "vanilla" not in names:
        raise EaglewireError(
            "unknown benchmark methods",
            expected=f"a subset of {known} including vanilla (the lossless reference)",
            found=str(list(names)),
        )


def make_methods(
    target: RunnableTarget,
    draft: Any,
    chain: TreeShape,
    tree: TreeShape,
    max_len: int,
    eos: int,
    names: Sequence[str] = METHODS,
    log: Callable[[str], None] | None = None,
    block_draft: Any | None = None,
) -> dict[str, Callable[[torch.Tensor, int], Run]]:
    """block_draft: the block drafter the BLOCK_METHODS rows decode with (None: those rows are refused)."""
    check_methods(names)
    block = block_shape_of(block_draft, names)
    verify_rows = tuple(
        s.num_draft_tokens
        for s, m in ((chain, "eagle_chain"), (tree, "eagle_tree"), (block, "dflash"))
        if m in names and s is not None
    )
    # one KV cache, reused by every method on our runtime
    rt = runtime(target, max_len, calibrate=True, log=log, verify_rows=verify_rows)

    def vanilla(ids: torch.Tensor, n: int) -> Run:
        t0 = time.perf_counter()
        toks = greedy_reference(rt, ids, n, eos={eos})
        return Run(toks, time.perf_counter() - t0)

    def eagle(shape: TreeShape, draft: Any = draft) -> Callable[[torch.Tensor, int], Run]:
        prop = proposer(draft, shape, max_len, rt)

        def run(ids: torch.Tensor, n: int) -> Run:
            toks, st = SpecDecoder(rt, prop).generate(ids, n, eos={eos})
            return Run(toks, st.total_s, st)

        return run

    make = {
        "hf_generate": lambda: lambda ids, n: _hf(target, ids, n, eos),
        "vanilla": lambda: vanilla,
        "prompt_lookup": lambda: lambda ids, n: _hf(target, ids, n, eos, prompt_lookup_num_tokens=10),
        "eagle_chain": lambda: eagle(chain),
        "eagle_tree": lambda: eagle(tree),
        "dflash": lambda: eagle(block, block_draft),
    }
    return {n: make[n]() for n in METHODS + BLOCK_METHODS if n in names}


def block_shape_of(block_draft: Any | None, names: Sequence[str]) -> TreeShape | None:
    """The chain the block rows verify per round (the drafter's whole block), None without block rows."""
    if not any(n in BLOCK_METHODS for n in names):
        return None
    if block_draft is None:
        raise EaglewireError(
            "a block-drafter row needs a block draft",
            expected="--dflash-draft DIR",
            found=f"methods {[n for n in names if n in BLOCK_METHODS]} without one",
            fix="pass --dflash-draft (a DFlash checkpoint) or drop the row",
        )
    return proposal_shape(block_draft.contract, None)


def question_categories(questions: str) -> dict[str, str]:
    """Question id -> category, from a JSONL question file's `category` fields (MT-bench's eight); empty for
    a file without them, or one that is not JSONL."""
    import json

    from eaglewire.data.conversations import resolve_source

    categories: dict[str, str] = {}
    try:
        with open(resolve_source(questions), encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line) if line.strip() else {}
                if "category" in rec:
                    categories[str(rec.get("id", rec.get("question_id")))] = rec["category"]
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}  # not a JSONL question file: no categories to spread over
    return categories


def spread_over_categories(questions: str, limit: int) -> list[Any]:
    """`limit` questions taken round-robin over the file's categories (in file order within each), so 8
    MT-bench prompts are one of each category, not the first 8 (all "writing"). A file without a
    `category` field gives its first `limit` questions."""
    convs = list(read_conversations(questions))
    categories = question_categories(questions)
    groups: dict[str, list[Any]] = {}
    for c in convs:
        groups.setdefault(categories.get(c.id, ""), []).append(c)
    picked, rank = [], 0
    while len(picked) < min(limit, len(convs)):
        picked += [g[rank] for g in groups.values() if rank < len(g)][: limit - len(picked)]
        rank += 1
    return picked


def bench_prompts(
    target: RunnableTarget, questions: str, limit: int, turns: int = 1, answers: str = "smollm2-mtbench-regen"
) -> list[torch.Tensor]:
    """Chat-templated prompts [1, P]: first turns of `limit` questions spread over the categories; with
    turns=2 also the second turns after the target's own regenerated first answers (from `answers`)."""
    convs = spread_over_categories(questions, limit)
    chats = [[{"role": "user", "content": c.user_turns[0]}] for c in convs]
    if turns == 2:
        regen = {c.id: c for c in read_conversations(answers)}
        missing = [c.id for c in convs if c.id not in regen or len(regen[c.id].turns) < 3]
        if missing:
            raise EaglewireError(
                "--turns 2 needs the target's regenerated first answers",
                expected=f"answers for ids {missing[:5]} in {answers}",
                found="missing",
                fix="eaglewire data regenerate --source mtbench --out FILE, then --answers FILE",
            )
        chats += [regen[c.id].messages()[:2] + [{"role": "user", "content": c.user_turns[1]}] for c in convs]
    return [chat_ids(target.tokenizer, m) for m in chats]


def run_bench(
    target: RunnableTarget,
    draft: Any,
    prompts: list[torch.Tensor],
    max_new: int,
    chain: TreeShape,
    tree: TreeShape,
    log: Callable[[str], None] = print,
    methods: Sequence[str] = METHODS,
    on_prompt: Callable[[int, int], None] | None = None,
    peer_eager: bool = False,
    repeats: int = 1,
    block_draft: Any | None = None,
    llamacpp_gguf: tuple[str, str] = ("q4_1", "f32"),
) -> dict:
    """Every method on every prompt, interleaved prompt by prompt, the peer rows (vLLM, llama.cpp: their
    servers paused between their requests) included. With `repeats` R every prompt runs R times:
    `repeats` in the result holds each repetition's medians and its ours / peer ratios, the method rows
    pool every run. `llamacpp_gguf`: the llama.cpp rows' (target, draft) GGUF precisions."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    eos = target.tokenizer.eos_token_id
    block = block_shape_of(block_draft, methods)
    wider = max((s for s in (chain, tree, block) if s is not None), key=lambda s: s.num_draft_tokens)
    max_len = cache_len(max(p.shape[1] for p in prompts) + max_new, wider)
    peers = [m for m in (*PEER_METHODS, *LLAMACPP_METHODS) if m in methods]
    dtype = str(target.dtype).removeprefix("torch.")  # every row runs in it: ours on the target, vLLM's told
    ours = make_methods(target, draft, chain, tree, max_len, eos, methods, log, block_draft)
    for fn in ours.values():  # warm-up, not counted
        fn(prompts[0], min(16, max_new))
    runs: dict[str, list[Run]] = {m: [] for m in (*ours, *peers)}
    per_repeat = []
    with ExitStack() as stack:
        servers = _peer_servers(
            stack, target, draft, prompts, max_new, chain.num_steps, peers, dtype, log, peer_eager, llamacpp_gguf
        )
        every = {**ours, **{name: _timed(servers[name].method(name)) for name in peers}}
        for r in range(repeats):
            if repeats > 1:
                log(f"repetition {r + 1}/{repeats}")
            _run_all(every, prompts, max_new, runs, log, on_prompt, offset=r * len(prompts))
            per_repeat.append(_repeat_summary({m: rs[-len(prompts) :] for m, rs in runs.items()}))
        reported = {name: servers[name].acceptance(name) for name in peers}  # the engines' own counters
    out = summarize(runs, chain, tree, max_new, reported, block)
    if repeats > 1:  # the method rows pool every repetition: `prompts` runs each time
        out["prompts"], out["repetitions"], out["repeats"] = len(prompts), repeats, per_repeat
    return {**out, "dtype": dtype, "draft_dtype": str(draft.fc.weight.dtype).removeprefix("torch.")}


def _peer_servers(
    stack: ExitStack,
    target: RunnableTarget,
    draft: Any,
    prompts: list[torch.Tensor],
    max_new: int,
    k: int,
    peers: list[str],
    dtype: str,
    log: Callable[[str], None],
    eager: bool,
    gguf: tuple[str, str],
) -> dict[str, Any]:
    """Each peer row's server group (vLLM's, llama.cpp's), started and paused, entered on `stack`."""
    groups = []
    if rows := [m for m in peers if m in PEER_METHODS]:
        groups.append(stack.enter_context(PeerServers(target, draft, prompts, max_new, k, rows, dtype, log, eager)))
    if rows := [m for m in peers if m in LLAMACPP_METHODS]:
        groups.append(stack.enter_context(LlamacppPeers(target, draft, prompts, max_new, k, rows, log, *gguf)))
    return {name: g for g in groups for name in g.names}


def _timed(fn: Callable[[torch.Tensor, int], tuple[list[int], float]]) -> Callable[[torch.Tensor, int], Run]:
    return lambda ids, n: Run(*fn(ids, n))


def _run_all(
    methods: dict[str, Callable[[torch.Tensor, int], Run]],
    prompts: list[torch.Tensor],
    max_new: int,
    runs: dict[str, list[Run]],
    log: Callable[[str], None],
    on_prompt: Callable[[int, int], None] | None,
    offset: int = 0,
) -> None:
    """Every method over every prompt; the order rotates per prompt (continuing across repetitions from
    `offset`), so no method always runs first."""
    names = list(methods)
    for i, ids in enumerate(prompts):
        turn = (offset + i) % len(names)
        for name in names[turn:] + names[:turn]:
            runs[name].append(methods[name](ids, max_new))
        log(
            f"prompt {i + 1}/{len(prompts)}: "
            + ", ".join(f"{m} {len(runs[m][-1].tokens) / runs[m][-1].seconds:.1f}" for m in names)
            + " tok/s"
        )
        if on_prompt:
            on_prompt(i + 1, len(prompts))


PEER_PAIRS = (
    ("eagle_chain", "vllm_eagle_chain"),
    ("vanilla", "vllm_vanilla"),  # ours, the peer's same row
    ("eagle_chain", "llamacpp_eagle_chain"),
    ("vanilla", "llamacpp_vanilla"),
)


def _repeat_summary(runs: dict[str, list[Run]]) -> dict:
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
