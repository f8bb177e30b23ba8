"""Benchmark: HF generate, our vanilla loop, HF prompt lookup, EAGLE-3 chain and tree — same prompts,
same chat template, same max new tokens, greedy — interleaved in ONE process (the method order rotates
per prompt, so machine noise hits every method alike). A warm-up prompt runs every method first and is
not counted. Reported per method: median tokens/s over prompts, speedup vs HF generate (ratio of
medians), tau and per-position acceptance for EAGLE, and whether the tokens equal our vanilla loop.
Optional peer rows run the real vLLM CPU build or llama.cpp's llama-server on the same prompts, interleaved with
ours (their servers paused between their requests: serve/peer.py, serve/llamacpp_peer.py).
The row names and defaults are serve/bench_rows.py's; the summary and its files serve/bench_summary.py's.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any, Callable, Sequence

import torch

from eaglewire.data.conversations import read_conversations
from eaglewire.errors import EaglewireError
from eaglewire.families import families_with, get_family, register_part
from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.compose import cache_len, proposal_shape, proposer, runtime
from eaglewire.serve.llamacpp_peer import LLAMACPP_METHODS, LlamacppPeers
from eaglewire.serve.peer import PEER_METHODS, PeerServers
from eaglewire.decoding.tree import TreeShape
from eaglewire.target.protocol import RunnableTarget
from eaglewire.data.template import chat_ids

# the row names and defaults, and the result's files: importable from here, as before their own modules
from eaglewire.serve.bench_rows import BLOCK_METHODS as BLOCK_METHODS
from eaglewire.serve.bench_rows import CHAIN_K as CHAIN_K
from eaglewire.serve.bench_rows import DEFAULT_METHODS as DEFAULT_METHODS
from eaglewire.serve.bench_rows import MAX_NEW_TOKENS as MAX_NEW_TOKENS
from eaglewire.serve.bench_rows import METHODS as METHODS
from eaglewire.serve.bench_rows import PROMPTS as PROMPTS
from eaglewire.serve.bench_rows import QUESTIONS as QUESTIONS
from eaglewire.serve.bench_summary import Run, repeat_summary, summarize
from eaglewire.serve.bench_summary import markdown as markdown
from eaglewire.serve.bench_summary import write as write


# The rows that decode with a draft, per drafter family (the name its contract carries): a run of one family
# benchmarks its own rows; vLLM's peer rows are served with the EAGLE-3 draft.
register_part("eagle3", "bench_rows", ("eagle_chain", "eagle_tree", *PEER_METHODS, *LLAMACPP_METHODS))
register_part("dflash", "bench_rows", BLOCK_METHODS)


def family_rows() -> dict[str, tuple[str, ...]]:
    """Each family's benchmark rows (its record's "bench_rows" part), by family name."""
    return {f.name: tuple(f.part("bench_rows")) for f in families_with("bench_rows")}


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
            per_repeat.append(repeat_summary({m: rs[-len(prompts) :] for m, rs in runs.items()}))
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
