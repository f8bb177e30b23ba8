"""`eaglewire data regenerate|show|capture|import|inspect`: parse, call the library, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from eaglewire.cli.common import (
    TARGET_HELP,
    DATA_HELP,
    add_command,
    device_option,
    err_console,
    load_target,
    out_console,
    parse_dtype,
    parse_ints,
    parse_taps,
    read_samples,
    resolve_convention,
    styled,
)
from eaglewire.data.conversations import DEFAULT_SOURCE, ReadStats
from eaglewire.data.regenerate import SERVER_IN_FLIGHT, GenerationSettings, RegenStats, regenerate
from eaglewire.data.samples import DEFAULT_MAX_LENGTH
from eaglewire.data.self_prompts import PromptSettings
from eaglewire.errors import EaglewireError

G = GenerationSettings()  # the one place the generation defaults live
DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}


def regenerate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Output .jsonl.gz (appended; resumes if it exists)."),
    source: str = typer.Option(DEFAULT_SOURCE, "--source", help="'sharegpt' (package) or a JSON/JSONL file."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target dir or 'smollm2-135m'."),
    limit: int = typer.Option(
        1000, "--limit", help="Regenerate the first N conversations of the source (those already in --out are kept)."
    ),
    max_new_tokens: int = typer.Option(
        G.max_new_tokens, "--max-new-tokens", help="Tokens generated per prompt (greedy unless a temperature is given)."
    ),
    temperature: float = typer.Option(G.temperature, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(
        G.top_p, "--top-p", help="Nucleus sampling: keep the smallest token set whose probability reaches this."
    ),
    seed: int = typer.Option(
        G.seed, "--seed", help="The sampling seed (the same seed and settings give the same answers)."
    ),
    max_turns: int = typer.Option(G.max_turns, "--max-turns", help="User turns answered per conversation."),
    max_prompt_tokens: int = typer.Option(
        G.max_prompt_tokens, "--max-prompt-tokens", help="Prompts longer than this many tokens are skipped."
    ),
    batch_size: Optional[int] = typer.Option(
        None,
        "--batch-size",
        min=1,
        help=f"HF generate's batch (default "
        f"{G.batch_size}); with --engine vllm or --server, conversations in "
        f"flight (default {SERVER_IN_FLIGHT}).",
    ),
    server: Optional[str] = typer.Option(
        None,
        "--server",
        help="OpenAI-compatible base URL (e.g. SGLang/vLLM) "
        "instead of the local target, e.g. http://127.0.0.1:30000/v1",
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to send to --server."),
    engine: str = typer.Option(
        "local",
        "--engine",
        help="'local' (HF generate in this process) or 'vllm' "
        "(starts vLLM's CPU build on 127.0.0.1 for the target: bash scripts/vllm_venv.sh).",
    ),
    dtype: str = typer.Option(
        "bfloat16",
        "--dtype",
        help="--engine vllm: float32 or bfloat16 (faster on AVX512-BF16/AMX CPUs, where bf16 runs natively).",
    ),
    start: int = typer.Option(
        0,
        "--start",
        help="Skip the first N conversations of the source (another file "
        "holds them): this file holds conversations [start, start + limit).",
    ),
    device: str = device_option(),
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
    if server:
        from transformers import AutoTokenizer

        from eaglewire.data.server_client import ServerGenerator
        from eaglewire.target.loader import resolve_target

        # The target's tokenizer measures prompts exactly as the local path does (max_prompt_tokens).
        gen: Any = ServerGenerator(server, model, s, tokenizer=AutoTokenizer.from_pretrained(resolve_target(target)[1]))
    else:
        from eaglewire.data.regenerate import LocalGenerator

        gen = LocalGenerator(load_target(target, device), s)
    _run_regen(gen, s, source, out, limit, start)


def _run_regen(gen: Any, s: GenerationSettings, source: str, out: Path, limit: int, start: int) -> None:
    read_stats = ReadStats()
    cols = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} conv"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, console=err_console) as progress:
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


P = PromptSettings()  # the self-prompt defaults (data/self_prompts.py)


def self_prompts_cmd(
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output .jsonl.gz of one-turn conversations (resumes if it exists)."
    ),
    count: int = typer.Option(
        ...,
        "--count",
        help="Draw samples 0..N-1 (duplicates, unfinished ones and "
        "benchmark questions are recorded as skipped, so fewer prompts are kept).",
    ),
    target: Optional[str] = typer.Option(
        None, "--target", "-t", help="Target dir or 'smollm2-135m' (an instruct model)."
    ),
    temperature: float = typer.Option(P.temperature, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(
        P.top_p, "--top-p", help="Nucleus sampling: keep the smallest token set whose probability reaches this."
    ),
    max_new_tokens: int = typer.Option(
        P.max_new_tokens, "--max-new-tokens", help="A prompt still running at this length is dropped as unfinished."
    ),
    seed: int = typer.Option(P.seed, "--seed", help="Sample k uses seed + k."),
    batch_size: int = typer.Option(P.batch_size, "--batch-size", help="Requests in flight."),
    exclude: str = typer.Option(
        "mtbench",
        "--exclude",
        help="Benchmark sources whose questions (and their "
        "60-character prefixes) are never kept, '+'-joined; '' for none.",
    ),
    server: Optional[str] = typer.Option(
        None,
        "--server",
        help="OpenAI-compatible base URL to sample from "
        "instead of starting vLLM's CPU build, e.g. http://127.0.0.1:30000/v1",
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to send to --server."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="vLLM's dtype when no --server is given."),
) -> None:
    """Sample user prompts from the target itself (Magpie): its chat template up to the user's text, sampled.

    Answer them with `data regenerate --source OUT --engine vllm`. Needs vLLM's CPU build
    (bash scripts/vllm_venv.sh) or --server."""
    from eaglewire.vllm_client.server import VLLM_VERSION, VllmServer
    from eaglewire.data.conversations import read_conversations
    from eaglewire.data.self_prompts import banned_keys, pre_query_text, sample_self_prompts
    from eaglewire.data.server_client import CompletionSampler

    s = PromptSettings(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size
    )
    tgt = load_target(target)
    pre = pre_query_text(tgt.tokenizer)
    ids = list(tgt.tokenizer(pre, add_special_tokens=False)["input_ids"])
    banned = banned_keys(
        t for src in filter(None, exclude.split("+")) for c in read_conversations(src) for t in c.user_turns
    )
    meta = {
        "kind": "self-prompts",
        "pre_query": pre,
        "target": tgt.identity.config_sha256,
        "name": tgt.name,
        "engine": server or f"vllm {VLLM_VERSION} {dtype}",
    }
    cols = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} drawn"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]

    def run(base_url: str, name: Optional[str]) -> Any:
        sampler = CompletionSampler(
            base_url, name, ids, max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p
        )
        with Progress(*cols, console=err_console) as progress:
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

    if server:
        stats = run(server, model)
    else:
        err_console.print(f"starting vLLM {VLLM_VERSION} ({dtype}) for {tgt.name}")
        with VllmServer(
            tgt.path, dtype=dtype, max_model_len=len(ids) + s.max_new_tokens + 16, max_num_seqs=s.batch_size
        ) as srv:
            stats = run(srv.base_url, srv.model_name)
    out_console.print(
        f"{stats.kept} prompts kept of {stats.drawn} drawn in {out} ({stats.new_tokens} new tokens "
        f"this run, {stats.tokens_per_s:.0f} tok/s); skipped: {stats.skipped}"
    )


def show_cmd(
    data: str = typer.Option(
        DEFAULT_SOURCE, "--data", help="Regenerated .jsonl.gz, any conversation file, or 'sharegpt'."
    ),
    index: int = typer.Option(0, "--index", help="Which conversation (0-based, among valid ones)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Whose tokenizer and chat template."),
    split_turns: bool = typer.Option(False, "--split-turns", help="One sample per assistant turn."),
    template_kwargs: str = typer.Option("{}", "--template-kwargs", help="JSON, e.g. '{\"enable_thinking\": false}'"),
) -> None:
    """Print one rendered conversation with the loss-masked (trained) tokens highlighted."""
    from rich.text import Text
    from transformers import AutoTokenizer

    from eaglewire.data.conversations import ReadStats, read_conversations
    from eaglewire.data.template import render_with_mask
    from eaglewire.target.loader import resolve_target

    stats = ReadStats()
    conv = next((c for i, c in enumerate(read_conversations(data, stats)) if i == index), None)
    if conv is None:  # the count of valid ones, and the skipped records (an index counts valid ones only)
        raise EaglewireError(
            f"no conversation {index} in {data}: --index counts valid conversations only",
            expected=f"--index from 0 to {stats.kept - 1}",
            found=f"{stats.kept} valid conversation(s); {stats.summary()}",
            fix="pass a smaller --index",
        )
    if stats.read > stats.kept:
        err_console.print(
            f"note: --index {index} counts valid conversations; records skipped before it: {stats.summary()}",
            highlight=False,
        )
    tok = AutoTokenizer.from_pretrained(resolve_target(target)[1])
    for sample in render_with_mask(
        tok, conv.messages(), split_turns=split_turns, template_kwargs=json.loads(template_kwargs)
    ):
        text = Text()
        for tid, m in zip(sample.input_ids, sample.loss_mask):
            text.append(tok.decode([tid]), style="bold green on grey15" if m else "dim")
        out_console.print(text)
        out_console.print(
            styled(
                (conv.id, "bold"), f": {len(sample.input_ids)} tokens, {sample.num_masked} trained on (highlighted)\n"
            )
        )


def capture_cmd(
    data: str = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Feature directory (resumes if it exists)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=TARGET_HELP),
    taps: Optional[str] = typer.Option(
        None, "--taps", help="Tap ids (default: --family's taps, boundaries [2, L//2, L-3] for eagle3)."
    ),
    taps_from: str = typer.Option(
        "boundary",
        "--taps-from",
        help="The numbering --taps is given in: boundary (eaglewire's), or an engine's "
        "layer ids (vllm, sglang, specforge, ...).",
    ),
    family: str = typer.Option(
        "eagle3",
        "--family",
        help="Whose default taps to capture when --taps is omitted: "
        "eagle3, or dflash (z-lab's five). Features hold taps only: any family reading "
        "them trains on them.",
    ),
    max_length: int = typer.Option(
        DEFAULT_MAX_LENGTH, "--max-length", help="Tokens per sample; longer conversations are cut at this length."
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N conversations (default: all)."),
    skip: int = typer.Option(
        0,
        "--skip",
        min=0,
        help="Skip the first N valid conversations (captured into "
        "another directory, e.g. by an earlier capture): capture only what is new.",
    ),
    shard_samples: int = typer.Option(
        256, "--shard-samples", help="Samples per feature shard file (smaller shards: less memory while reading)."
    ),
    batch_size: int = typer.Option(
        4,
        "--batch-size",
        help="Samples per target forward while capturing (memory vs speed; the features are the same).",
    ),
    split_turns: bool = typer.Option(
        False,
        "--split-turns",
        help="One sample per assistant turn (each with its history) instead of one per conversation.",
    ),
    target_dtype: str = typer.Option(
        "float32",
        "--target-dtype",
        help="Run the target in float32 or bfloat16 "
        "(AVX512-BF16/AMX CPUs: ~3x faster; taps within ~0.5%, top-1 agrees 99%).",
    ),
    store_dtype: str = typer.Option(
        "bfloat16",
        "--store-dtype",
        help="bfloat16 (4.6 KB/token for 3 taps of 576) or float32 (twice that) for the stored taps and final state.",
    ),
    device: str = device_option(),
) -> None:
    """Capture tapped target states for training into resumable safetensors shards + manifest."""
    import torch

    from eaglewire.capture.features import capture_features

    store = getattr(torch, parse_dtype(store_dtype, DTYPES, "--store-dtype"))
    run_dtype = getattr(torch, parse_dtype(target_dtype, DTYPES, "--target-dtype"))
    tgt = load_target(target, device, dtype=run_dtype)
    samples = read_samples(tgt, data, max_length, limit, split_turns, skip=skip)
    from eaglewire.train.objectives import objective

    default = objective(family).default_taps  # a clear error for a family with no training record
    contract = tgt.contract(parse_taps(tgt, taps, taps_from) if taps else default(tgt.num_layers))
    with Progress(console=err_console) as progress:
        task = progress.add_task("capturing shards", total=None)
        manifest = capture_features(
            tgt,
            contract,
            samples,
            out,
            pad_id=tgt.pad_id,
            shard_samples=shard_samples,
            batch_size=batch_size,
            dtype=store,
            on_shard=lambda k, n, _t: progress.update(task, completed=k, total=n),
        )
    out_console.print(
        f"{manifest['samples']} samples, {manifest['tokens']} tokens in "
        f"{len(manifest['shards'])} shards -> {out} (contract {contract.fingerprint()})"
    )


def import_cmd(
    src: Path = typer.Argument(
        ...,
        help="The dump: SpecForge's rows_*/data_*.ckpt[.gz] dir, or speculators' "
        "Arrow dataset with hidden_states/hs_*.safetensors.",
    ),
    fmt: str = typer.Option("auto", "--format", help="specforge, speculators or auto (from the layout)."),
    out: Path = typer.Option(..., "--out", "-o", help="Feature directory to write (resumes if it exists)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=TARGET_HELP),
    taps: Optional[str] = typer.Option(
        None, "--taps", help="The layer ids the tool was run with (default: its default ids for this target)."
    ),
    taps_from: Optional[str] = typer.Option(
        None, "--taps-from", help="Their convention (default: the format's own: specforge, or vllm for speculators)."
    ),
    shard_samples: int = typer.Option(
        256, "--shard-samples", help="Samples per feature shard file (smaller shards: less memory while reading)."
    ),
    store_dtype: str = typer.Option(
        "bfloat16",
        "--store-dtype",
        help="The dtype features are stored in (bfloat16 halves the disk; float32 keeps every bit).",
    ),
    verify: int = typer.Option(
        2,
        "--verify",
        help="Samples checked against the target's own forward before "
        "anything is written (0 skips, for a target too large to run here).",
    ),
    states_dir: Optional[Path] = typer.Option(
        None,
        "--states-dir",
        help="speculators: the hs_*.safetensors directory when it is not DIR/hidden_states (its --output).",
    ),
) -> None:
    """Import a SpecForge or speculators hidden-state dump as eaglewire feature shards (streamed, resumable)."""
    import torch

    from eaglewire.capture.dumps import import_dump

    store = getattr(torch, parse_dtype(store_dtype, DTYPES, "--store-dtype"))
    tgt = load_target(target)
    with Progress(console=err_console) as progress:
        task = progress.add_task("importing shards", total=None)
        manifest = import_dump(
            src,
            fmt,
            tgt,
            out,
            taps=parse_ints(taps) if taps else None,
            taps_from=resolve_convention(taps_from, tgt),
            shard_samples=shard_samples,
            dtype=store,
            verify=verify,
            on_shard=lambda k, n, _t: progress.update(task, completed=k, total=n),
            states_dir=states_dir,
        )
    out_console.print(
        f"{manifest['samples']} samples, {manifest['tokens']} tokens in {len(manifest['shards'])} "
        f"shards -> {out} (taps {manifest['contract']['taps']} as boundaries; from {src})"
    )


def inspect_cmd(
    src: Path = typer.Argument(..., help="A SpecForge or speculators dump, or an eaglewire feature directory."),
    fmt: str = typer.Option("auto", "--format", help="specforge, speculators, eaglewire or auto."),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        "-t",
        help="Name the stored boundaries by comparing a few samples with this target's own states.",
    ),
    no_target: bool = typer.Option(False, "--no-target", help="Shapes, dtypes, counts and NaNs only."),
    taps: Optional[str] = typer.Option(None, "--taps", help="The layer ids you believe the dump holds."),
    taps_from: Optional[str] = typer.Option(
        None,
        "--taps-from",
        help="Their convention (specforge, speculators, vllm, sglang, boundary; default: the format's own).",
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="Scan at most N samples for the statistics."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout, for scripts and CI."),
    states_dir: Optional[Path] = typer.Option(
        None,
        "--states-dir",
        help="speculators: the hs_*.safetensors directory when it is not DIR/hidden_states (its --output).",
    ),
) -> None:
    """Say what a hidden-state dump holds; exit 1 when it is not what was declared or is damaged."""
    from eaglewire.capture.dumps.report import inspect_dump

    tgt = None if no_target else load_target(target)
    report = inspect_dump(
        src,
        fmt,
        tgt,
        declared_taps=parse_ints(taps) if taps else None,
        taps_from=resolve_convention(taps_from, tgt),
        limit=limit,
        states_dir=states_dir,
    )
    if as_json:
        out_console.print_json(json.dumps(report.to_dict()))
    else:
        out_console.print("\n".join(report.lines()))
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(
        help="Training data: regenerate answers, inspect loss masks, capture features, "
        "import and inspect other tools' hidden-state dumps.",
        no_args_is_help=True,
    )
    add_command(data_app, regenerate_cmd, "regenerate")
    add_command(data_app, self_prompts_cmd, "self-prompts")
    add_command(data_app, show_cmd, "show")
    add_command(data_app, capture_cmd, "capture")
    add_command(data_app, import_cmd, "import")
    add_command(data_app, inspect_cmd, "inspect")
    app.add_typer(data_app, name="data")
