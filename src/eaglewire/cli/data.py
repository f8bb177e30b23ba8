"""`eaglewire data regenerate|self-prompts|show|capture|import|inspect`: parse, call the library, print.

The target's own text (regenerate, self-prompts) is `cli.data_generation`'s; this module holds the rest and the
`data` group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress

from eaglewire.cli.common import (
    add_command,
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
from eaglewire.cli.data_generation import regenerate_cmd, self_prompts_cmd
from eaglewire.cli.options import (
    DataOpt,
    DeviceOpt,
    JsonOpt,
    LimitOpt,
    MaxLengthOpt,
    ShardSamplesOpt,
    SplitTurnsOpt,
    StatesDirOpt,
    TapsFromOpt,
    TargetOpt,
)
from eaglewire.data.conversations import DEFAULT_SOURCE
from eaglewire.data.samples import DEFAULT_MAX_LENGTH
from eaglewire.errors import EaglewireError
from eaglewire.hw import DEVICE_DEFAULT

DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
FAMILY_HELP = (
    "Whose default taps to capture when --taps is omitted: eagle3, or dflash (z-lab's five). Features hold taps "
    "only: any family reading them trains on them."
)
SKIP_HELP = (
    "Skip the first N valid conversations (captured into "
    "another directory, e.g. by an earlier capture): capture only what is new."
)
TARGET_DTYPE_HELP = (
    "Run the target in float32 or bfloat16 (AVX512-BF16/AMX CPUs: ~3x faster; taps within ~0.5%, top-1 agrees 99%)."
)
CAPTURE_STORE_HELP = (
    "bfloat16 (4.6 KB/token for 3 taps of 576) or float32 (twice that) for the stored taps and final state."
)
DUMP_HELP = (
    "The dump: SpecForge's rows_*/data_*.ckpt[.gz] dir, or speculators' "
    "Arrow dataset with hidden_states/hs_*.safetensors."
)
VERIFY_HELP = (
    "Samples checked against the target's own forward before "
    "anything is written (0 skips, for a target too large to run here)."
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
    data: DataOpt = ...,
    out: Path = typer.Option(..., "--out", "-o", help="Feature directory (resumes if it exists)."),
    target: TargetOpt = None,
    taps: Optional[str] = typer.Option(
        None, "--taps", help="Tap ids (default: --family's taps, boundaries [2, L//2, L-3] for eagle3)."
    ),
    taps_from: TapsFromOpt = "boundary",
    family: str = typer.Option("eagle3", "--family", help=FAMILY_HELP),
    max_length: MaxLengthOpt = DEFAULT_MAX_LENGTH,
    limit: LimitOpt = None,
    skip: int = typer.Option(0, "--skip", min=0, help=SKIP_HELP),
    shard_samples: ShardSamplesOpt = 256,
    batch_size: int = typer.Option(
        4,
        "--batch-size",
        help="Samples per target forward while capturing (memory vs speed; the features are the same).",
    ),
    split_turns: SplitTurnsOpt = False,
    target_dtype: str = typer.Option("float32", "--target-dtype", help=TARGET_DTYPE_HELP),
    store_dtype: str = typer.Option("bfloat16", "--store-dtype", help=CAPTURE_STORE_HELP),
    device: DeviceOpt = DEVICE_DEFAULT,
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
    src: Path = typer.Argument(..., help=DUMP_HELP),
    fmt: str = typer.Option("auto", "--format", help="specforge, speculators or auto (from the layout)."),
    out: Path = typer.Option(..., "--out", "-o", help="Feature directory to write (resumes if it exists)."),
    target: TargetOpt = None,
    taps: Optional[str] = typer.Option(
        None, "--taps", help="The layer ids the tool was run with (default: its default ids for this target)."
    ),
    taps_from: Optional[str] = typer.Option(
        None, "--taps-from", help="Their convention (default: the format's own: specforge, or vllm for speculators)."
    ),
    shard_samples: ShardSamplesOpt = 256,
    store_dtype: str = typer.Option(
        "bfloat16",
        "--store-dtype",
        help="The dtype features are stored in (bfloat16 halves the disk; float32 keeps every bit).",
    ),
    verify: int = typer.Option(2, "--verify", help=VERIFY_HELP),
    states_dir: StatesDirOpt = None,
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
    as_json: JsonOpt = False,
    states_dir: StatesDirOpt = None,
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
