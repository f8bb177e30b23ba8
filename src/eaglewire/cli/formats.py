"""`eaglewire export` / `eaglewire import`: native draft <-> engine layouts, strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.cli.common import add_command, load_target, out_console, parse_dtype

FORMAT_HELP = ("sglang (PR #25454 layer-id rule), sglang-legacy (always +1), vllm / speculators, eagle "
               "(SafeAILab), specforge, native (eaglewire's own checkpoint)")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def export_cmd(
    draft: Path = typer.Argument(..., help="Native draft checkpoint directory (from `eaglewire train`)."),
    fmt: str = typer.Option(..., "--format", "-f", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Checks the draft belongs to this target."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: as trained)."),
    with_embedding: bool = typer.Option(False, "--with-embedding", help="Also write the (frozen) target embedding."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="vllm/speculators: the target path or hub id "
                                           "vLLM should load (default: the --target path, else its name)."),
) -> None:
    """Write a draft in an engine's layout, plus eaglewire_contract.json (engines ignore it)."""
    import torch

    from eaglewire.checkpoint import load_checkpoint
    from eaglewire.formats.convert import export_draft
    from eaglewire.engines import NATIVE, engine_for

    tgt = load_target(target) if target else None
    d = load_checkpoint(draft, target=tgt)
    cast = getattr(torch, parse_dtype(dtype, DTYPES, "--dtype")) if dtype is not None else None
    path = export_draft(d, d.contract, out, fmt, dtype=cast, with_embedding=with_embedding,
                        verifier=verifier or (str(tgt.path) if tgt is not None and tgt.path else None))
    ids = "" if fmt == NATIVE else f"layer ids {list(d.contract.engine_ids(engine_for(fmt).convention))}; "
    out_console.print(f"{fmt} export -> {path} ({ids}taps {list(d.contract.taps)})")


def import_cmd(
    directory: Path = typer.Argument(..., help="An exported draft directory."),
    fmt: str = typer.Option(..., "--format", "-f", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Native checkpoint directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Needed when the export has no contract file."),
) -> None:
    """Read an engine-layout draft strictly into a native checkpoint."""
    from eaglewire.checkpoint import save_checkpoint
    from eaglewire.formats.convert import import_draft

    tgt = load_target(target) if target else None
    d, contract = import_draft(directory, fmt, target=tgt)
    save_checkpoint(d, contract, out)
    out_console.print(f"imported {fmt} draft -> {out} (taps {list(contract.taps)}, "
                      f"contract {contract.fingerprint()})")


def register(app: typer.Typer) -> None:
    add_command(app, export_cmd, "export", help="Export a draft: " + FORMAT_HELP)
    add_command(app, import_cmd, "import", help="Import a draft: " + FORMAT_HELP)
