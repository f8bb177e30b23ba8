"""The bench stage of `eaglewire run`: the trained draft's rows (and the peer engines' where asked for and
at hand) on the run's bench prompts, and τ of the draft training started from against the trained one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglewire.errors import EaglewireError
from eaglewire.pipeline.context import Ctx, draft_vocab_file, resolve_init


def bench(ctx: Ctx, work: Path) -> dict[str, Any]:
    from eaglewire.compose import load_draft
    from eaglewire.vllm_client.server import vllm_available
    from eaglewire.serve import bench as spec_bench
    from eaglewire.serve.peer import PEER_METHODS
    from eaglewire.hw import draft_dtype

    b = ctx.cfg.bench
    draft = load_draft(
        Path(ctx.results["train"]["draft"]), ctx.target, dtype=draft_dtype(b.draft_dtype, ctx.target.dtype, ctx.device)
    )
    prompts = spec_bench.bench_prompts(ctx.target, b.source, b.prompts)
    methods = list(b.methods)
    if b.vllm == "on" or (b.vllm == "auto" and vllm_available()):
        methods += list(PEER_METHODS)
        ctx.log(
            "bench: vLLM's CPU build is "
            + ("required (bench.vllm on)" if b.vllm == "on" else "installed")
            + ": adding its peer rows"
        )
    elif b.vllm == "auto":
        ctx.log("bench: vLLM's CPU build is not installed: no peer rows (bash scripts/vllm_venv.sh adds them)")
    methods += _llamacpp_rows(ctx)
    family = draft.contract.family
    rows = spec_bench.rows_for(family, methods)
    if dropped := [m for m in methods if m not in rows]:
        ctx.log(f"bench: a {family} draft: rows {dropped} (other families' drafts) are not run")
    block = draft if any(m in spec_bench.BLOCK_METHODS for m in rows) else None  # the block rows' drafter
    result = spec_bench.run_bench(
        ctx.target,
        draft,
        prompts,
        b.max_new_tokens,
        b.chain(),
        b.tree(),
        log=lambda s: None,
        methods=rows,
        block_draft=block,
        on_prompt=lambda i, n: ctx.progress(i, n, "prompts"),
        llamacpp_gguf=(b.llamacpp_target, "f32"),
    )
    result.update(questions=b.source, draft=ctx.results["train"]["draft"], turns=1)
    if b.tau_prompts:
        result["tau_before_after"] = _tau_before_after(ctx, prompts[: b.tau_prompts])
    spec_bench.write(result, work)
    return {"result": result, "json": str(work / "bench.json"), "png": str(work / "bench.png")}


def _llamacpp_rows(ctx: Ctx) -> list[str]:
    """llama.cpp's rows when bench.llamacpp asks for them (auto: a llama-server found and a target GGUF at hand)."""
    from eaglewire.serve.llamacpp import BUILD_HINT, find_llama_server
    from eaglewire.serve.llamacpp_peer import LLAMACPP_METHODS
    from eaglewire.target.embedded import embedded_key

    b = ctx.cfg.bench
    found = find_llama_server()
    if b.llamacpp == "off":
        return []
    if b.llamacpp == "on" and found is None:
        raise EaglewireError(
            "bench.llamacpp is on but no llama-server is found",
            expected="a llama-server binary",
            found="EAGLEWIRE_LLAMA_SERVER unset, none built, none on PATH",
            fix=BUILD_HINT,
        )
    if b.llamacpp == "auto" and (
        found is None or (embedded_key(ctx.target.path) is None and b.llamacpp_target == "q4_1")
    ):
        why = "no llama-server found (" + BUILD_HINT + ")" if found is None else "the target ships no Q4_1 GGUF"
        ctx.log(f"bench: no llama.cpp rows: {why}")
        return []
    ctx.log(f"bench: llama-server {found}: adding llama.cpp's rows ({b.llamacpp_target} target, f32 draft GGUF)")
    return list(LLAMACPP_METHODS)


def _tau_before_after(ctx: Ctx, prompts: list) -> dict[str, Any]:
    """τ of the draft training started from (the warm start, or the fresh initial weights) and of the trained
    draft: the same prompts, chain, new tokens and dtype (float32 drafts on the plain runtime, the target's
    dtype), so the difference is the training's alone."""
    from eaglewire.compose import load_draft, measure_tau
    from eaglewire.workflows import start_draft

    b = ctx.cfg.bench
    cfg = resolve_init(ctx, ctx.cfg.train_config())  # the run's family section merged in, as the train stage's
    vocab = draft_vocab_file(ctx, cfg)
    before, contract = start_draft(ctx.target, ctx.contract.taps, vocab, cfg)
    after = load_draft(Path(ctx.results["train"]["draft"]), ctx.target)
    taus = {}
    for i, (name, draft, con) in enumerate((("before", before, contract), ("after", after, None))):
        ctx.progress(i, 2, f"τ {name} training")
        taus[name] = measure_tau(ctx.target, draft, prompts, b.chain(), b.max_new_tokens, contract=con).tau
    start = f"the warm start {cfg.init_from}" if cfg.init_from else f"a fresh draft (seed {cfg.seed})"
    return {
        **taus,
        "start": start,
        "family": contract.family,
        "released": bool(cfg.init_from),
        "chain_k": b.chain_k,
        "prompts": len(prompts),
        "max_new_tokens": b.max_new_tokens,
    }
