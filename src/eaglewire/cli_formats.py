"""`eaglewire export` / `eaglewire import`: native draft <-> engine layouts, strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.formats.convert import FORMATS

FORMAT_HELP = ("sglang (PR #25454 layer-id rule), sglang-legacy (always +1), vllm / speculators, eagle "
               "(SafeAILab), specforge")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _cli():
    from eaglewire import cli

    return cli


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
    cli = _cli()

    @cli.friendly
    def run() -> None:
        import torch

        from eaglewire.checkpoint import load_checkpoint
        from eaglewire.formats.convert import export_draft

        tgt = cli._load(target) if target else None
        d = load_checkpoint(draft, target=tgt)
        if dtype is not None and dtype not in DTYPES:
            raise cli.EaglewireError("unknown --dtype", expected=", ".join(DTYPES), found=dtype)
        path = export_draft(d, d.contract, out, fmt, dtype=getattr(torch, DTYPES[dtype]) if dtype else None,
                            with_embedding=with_embedding,
                            verifier=verifier or (str(tgt.path) if tgt is not None and tgt.path else None))
        from eaglewire.formats.layouts import LAYOUTS

        ids = d.contract.engine_ids(LAYOUTS[fmt].convention)
        cli.out_console.print(f"{fmt} export -> {path} (layer ids {list(ids)}; taps {list(d.contract.taps)})")

    run()


def import_cmd(
    directory: Path = typer.Argument(..., help="An exported draft directory."),
    fmt: str = typer.Option(..., "--format", "-f", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Native checkpoint directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Needed when the export has no contract file."),
) -> None:
    """Read an engine-layout draft strictly into a native checkpoint."""
    cli = _cli()

    @cli.friendly
    def run() -> None:
        from eaglewire.checkpoint import save_checkpoint
        from eaglewire.formats.convert import import_draft

        tgt = cli._load(target) if target else None
        d, contract = import_draft(directory, fmt, target=tgt)
        save_checkpoint(d, contract, out)
        cli.out_console.print(f"imported {fmt} draft -> {out} (taps {list(contract.taps)}, "
                              f"contract {contract.fingerprint()})")

    run()


def register(app: typer.Typer) -> None:
    app.command("export", help="Export a draft: " + FORMAT_HELP)(export_cmd)
    app.command("import", help="Import a draft: " + FORMAT_HELP)(import_cmd)


__all__ = ["FORMATS", "register"]
