"""`eaglewire data regenerate|self-prompts`: training text the target writes itself (answers to a source's user
turns; user prompts sampled from its own chat template), locally, through vLLM's CPU build or a server.
`cli.data` registers them in the `data` group."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from eaglewire.cli.common import err_console, load_target, out_console
from eaglewire.cli.options import DeviceOpt, MaxNewTokensOpt
from eaglewire.data.conversations import DEFAULT_SOURCE, ReadStats
from eaglewire.data.regenerate import SERVER_IN_FLIGHT, GenerationSettings, RegenStats, regenerate
from eaglewire.data.self_prompts import PromptSettings
from eaglewire.errors import EaglewireError
from eaglewire.hw import DEVICE_DEFAULT

G = GenerationSettings()  # the one place the generation defaults live
P = PromptSettings()  # the self-prompt defaults (data/self_prompts.py)

# the options both commands take: the sampling, and the server they may sample from
TopPOpt = Annotated[
    float, typer.Option("--top-p", help="Nucleus sampling: keep the smallest token set whose probability reaches this.")
]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model name to send to --server.")]

REGEN_LIMIT_HELP = "Regenerate the first N conversations of the source (those already in --out are kept)."
BATCH_HELP = (
    f"HF generate's batch (default {G.batch_size}); with --engine vllm or --server, conversations in "
    f"flight (default {SERVER_IN_FLIGHT})."
)
REGEN_SERVER_HELP = (
    "OpenAI-compatible base URL (e.g. SGLang/vLLM) instead of the local target, e.g. http://127.0.0.1:30000/v1"
)
ENGINE_HELP = (
    "'local' (HF generate in this process) or 'vllm' "
    "(starts vLLM's CPU build on 127.0.0.1 for the target: bash scripts/vllm_venv.sh)."
)
VLLM_DTYPE_HELP = "--engine vllm: float32 or bfloat16 (faster on AVX512-BF16/AMX CPUs, where bf16 runs natively)."
START_HELP = (
    "Skip the first N conversations of the source (another file "
    "holds them): this file holds conversations [start, start + limit)."
)
COUNT_HELP = (
    "Draw samples 0..N-1 (duplicates, unfinished ones and "
    "benchmark questions are recorded as skipped, so fewer prompts are kept)."
)
EXCLUDE_HELP = (
    "Benchmark sources whose questions (and their 60-character prefixes) are never kept, '+'-joined; '' for none."
)
SAMPLE_SERVER_HELP = (
    "OpenAI-compatible base URL to sample from instead of starting vLLM's CPU build, e.g. http://127.0.0.1:30000/v1"
)


def regenerate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Output .jsonl.gz (appended; resumes if it exists)."),
    source: str = typer.Option(DEFAULT_SOURCE, "--source", help="'sharegpt' (package) or a JSON/JSONL file."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target dir or 'smollm2-135m'."),
    limit: int = typer.Option(1000, "--limit", help=REGEN_LIMIT_HELP),
    max_new_tokens: MaxNewTokensOpt = G.max_new_tokens,
    temperature: float = typer.Option(G.temperature, "--temperature", help="0 = greedy."),
    top_p: TopPOpt = G.top_p,
    seed: int = typer.Option(
        G.seed, "--seed", help="The sampling seed (the same seed and settings give the same answers)."
    ),
    max_turns: int = typer.Option(G.max_turns, "--max-turns", help="User turns answered per conversation."),
    max_prompt_tokens: int = typer.Option(
        G.max_prompt_tokens, "--max-prompt-tokens", help="Prompts longer than this many tokens are skipped."
    ),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    server: Optional[str] = typer.Option(None, "--server", help=REGEN_SERVER_HELP),
    model: ModelOpt = None,
    engine: str = typer.Option("local", "--engine", help=ENGINE_HELP),
    dtype: str = typer.Option("bfloat16", "--dtype", help=VLLM_DTYPE_HELP),
    start: int = typer.Option(0, "--start", help=START_HELP),
    device: DeviceOpt = DEVICE_DEFAULT,
) -> None:
    """Re-answer every assistant turn with the target (resumable, append-only).

    With --engine vllm or --server, `--batch-size` conversations are in flight at once (a rolling pool)."""
    pooled = engine == "vllm" or server is not None  # a rolling pool of requests, not a padded batch
    batch_size = batch_size or (SERVER_IN_FLIGHT if pooled else G.batch_size)
    s = GenerationSettings(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        max_turns=max_turns,
        max_prompt_tokens=max_prompt_tokens,
        batch_size=batch_size,
    )
    if engine not in ("local", "vllm"):
        raise EaglewireError(f"unknown --engine {engine!r}", expected="local or vllm", found=engine)
    if engine == "vllm":
        return _regenerate_vllm(target, dtype, s, source, out, limit, start)
    _run_regen(_generator(server, model, target, device, s), s, source, out, limit, start)


def _generator(server: Optional[str], model: Optional[str], target: Optional[str], device: str, s: Any) -> Any:
    """The answers' writer: a client of --server, else HF generate on the target loaded here."""
    if server:
        from transformers import AutoTokenizer

        from eaglewire.data.server_client import ServerGenerator
        from eaglewire.target.loader import resolve_target

        # The target's tokenizer measures prompts exactly as the local path does (max_prompt_tokens).
        return ServerGenerator(server, model, s, tokenizer=AutoTokenizer.from_pretrained(resolve_target(target)[1]))
    from eaglewire.data.regenerate import LocalGenerator

    return LocalGenerator(load_target(target, device), s)


def _bar(unit: str) -> Progress:
    """A progress bar counting `unit`s, with the rate the task's `rate` field says, time elapsed and left."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} " + unit),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
    )


def _run_regen(gen: Any, s: GenerationSettings, source: str, out: Path, limit: int, start: int) -> None:
    read_stats = ReadStats()
    with _bar("conv") as progress:
        task = progress.add_task("regenerating", total=limit, rate="")

        def on_batch(st: RegenStats, _n: int) -> None:
            progress.update(
                task, completed=st.conversations, rate=f"{st.tokens_per_s:.1f} tok/s, {st.new_tokens} tokens"
            )

        stats = regenerate(source, out, gen, s, limit=limit, start=start, on_batch=on_batch, read_stats=read_stats)
    out_console.print(
        f"{stats.conversations} conversations in {out} ({stats.turns} turns, "
        f"{stats.new_tokens} new tokens this run, {stats.tokens_per_s:.1f} tok/s, "
        f"{stats.skipped_long} skipped as too long)"
    )
    out_console.print(f"source: {read_stats.summary()}")


def _regenerate_vllm(
    target: Optional[str], dtype: str, s: GenerationSettings, source: str, out: Path, limit: int, start: int
) -> None:
    """Serve the target with vLLM's CPU build for the run's duration and regenerate through it."""
    from eaglewire.vllm_client.server import VLLM_VERSION, vllm_regenerator

    tgt = load_target(target)  # its config identifies the file; its tokenizer measures prompts
    err_console.print(f"starting vLLM {VLLM_VERSION} ({dtype}) for {tgt.name} (a first start compiles, ~1-2 min)")
    with vllm_regenerator(tgt, s, dtype) as gen:
        err_console.print(f"vLLM serving {tgt.name} at {gen.url}")
        _run_regen(gen, s, source, out, limit, start)


def self_prompts_cmd(
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output .jsonl.gz of one-turn conversations (resumes if it exists)."
    ),
    count: int = typer.Option(..., "--count", help=COUNT_HELP),
    target: Optional[str] = typer.Option(
        None, "--target", "-t", help="Target dir or 'smollm2-135m' (an instruct model)."
    ),
    temperature: float = typer.Option(P.temperature, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: TopPOpt = P.top_p,
    max_new_tokens: int = typer.Option(
        P.max_new_tokens, "--max-new-tokens", help="A prompt still running at this length is dropped as unfinished."
    ),
    seed: int = typer.Option(P.seed, "--seed", help="Sample k uses seed + k."),
    batch_size: int = typer.Option(P.batch_size, "--batch-size", help="Requests in flight."),
    exclude: str = typer.Option("mtbench", "--exclude", help=EXCLUDE_HELP),
    server: Optional[str] = typer.Option(None, "--server", help=SAMPLE_SERVER_HELP),
    model: ModelOpt = None,
    dtype: str = typer.Option("bfloat16", "--dtype", help="vLLM's dtype when no --server is given."),
) -> None:
    """Sample user prompts from the target itself (Magpie): its chat template up to the user's text, sampled.

    Answer them with `data regenerate --source OUT --engine vllm`. Needs vLLM's CPU build
    (bash scripts/vllm_venv.sh) or --server."""
    from eaglewire.vllm_client.server import VLLM_VERSION, VllmServer
    from eaglewire.data.self_prompts import pre_query_text

    s = PromptSettings(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size
    )
    tgt = load_target(target)
    pre = pre_query_text(tgt.tokenizer)
    ids = list(tgt.tokenizer(pre, add_special_tokens=False)["input_ids"])
    meta = {
        "kind": "self-prompts",
        "pre_query": pre,
        "target": tgt.identity.config_sha256,
        "name": tgt.name,
        "engine": server or f"vllm {VLLM_VERSION} {dtype}",
    }
    draw = partial(_draw, ids=ids, out=out, count=count, s=s, meta=meta, banned=_banned(exclude))
    if server:
        stats = draw(server, model)
    else:
        err_console.print(f"starting vLLM {VLLM_VERSION} ({dtype}) for {tgt.name}")
        with VllmServer(
            tgt.path, dtype=dtype, max_model_len=len(ids) + s.max_new_tokens + 16, max_num_seqs=s.batch_size
        ) as srv:
            stats = draw(srv.base_url, srv.model_name)
    out_console.print(
        f"{stats.kept} prompts kept of {stats.drawn} drawn in {out} ({stats.new_tokens} new tokens "
        f"this run, {stats.tokens_per_s:.0f} tok/s); skipped: {stats.skipped}"
    )


def _banned(exclude: str) -> Any:
    """The keys of every user turn of the '+'-joined benchmark sources --exclude names (never kept)."""
    from eaglewire.data.conversations import read_conversations
    from eaglewire.data.self_prompts import banned_keys

    return banned_keys(
        t for src in filter(None, exclude.split("+")) for c in read_conversations(src) for t in c.user_turns
    )


def _draw(
    base_url: str,
    name: Optional[str],
    *,
    ids: list[int],
    out: Path,
    count: int,
    s: PromptSettings,
    meta: dict,
    banned: Any,
) -> Any:
    """Samples 0..count-1 from the server at `base_url` (model `name`), continuing the pre-query `ids`, into `out`."""
    from eaglewire.data.self_prompts import sample_self_prompts
    from eaglewire.data.server_client import CompletionSampler

    sampler = CompletionSampler(
        base_url, name, ids, max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p
    )
    with _bar("drawn") as progress:
        task = progress.add_task("self-prompting", total=count, rate="")
        return sample_self_prompts(
            sampler,
            out,
            count,
            s,
            meta,
            banned,
            on_batch=lambda st: progress.update(
                task, completed=st.drawn, rate=f"{st.kept} kept, {st.tokens_per_s:.0f} tok/s"
            ),
        )
