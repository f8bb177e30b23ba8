"""`eaglewire export` / `eaglewire import`: native draft <-> engine layouts, strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.cli.common import add_command, err_console, load_target, out_console, parse_dtype

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

    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.convert import export_draft
    from eaglewire.export.engines import NATIVE, engine_for

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
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Needed when the export has no contract "
                                         "file: the trained boundaries are then measured on it."),
    measure: bool = typer.Option(True, "--measure/--no-measure", help="Without a contract file: measure the "
                                 "trained boundaries (default), or take the config's layer ids as they are."),
) -> None:
    """Read an engine-layout draft strictly into a native checkpoint; a draft from another tool gets a
    contract marked as inferred, with the evidence."""
    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.workflows import import_any

    tgt = load_target(target) if target else None
    with err_console.status("importing (a draft without a contract file is measured on the target)"):
        d, contract, m = import_any(directory, fmt, tgt, measure=measure)
    save_checkpoint(d, contract, out)
    how = {None: "", "measured": "inferred by measurement, ", "engine_config": "inferred from the config's ids, "}
    out_console.print(f"imported {fmt} draft -> {out} (taps {list(contract.taps)}, "
                      f"{how[(contract.inferred or {}).get('source')]}contract {contract.fingerprint()})")
    if m is not None:
        out_console.print(_measured_summary(m), highlight=False)


def _measured_summary(m) -> str:
    best = m.scores[m.best]
    line = f"measured: the draft predicts best from boundaries {list(m.best)} (NLL {best.mean_nll:.2f}, " \
           f"agreement {best.agreement:.2f}, {m.tokens} tokens)"
    if m.delivered != m.best:
        got = "cannot be captured" if m.delivered is None else f"deliver {list(m.delivered)}"
        line += f"; the config's ids {got}: the imported contract records {list(m.best)}, and exports write those"
    if m.weak:
        line += f"; weak evidence (worst - best = {m.spread:.2f} nats)"
    return line


def register(app: typer.Typer) -> None:
    add_command(app, export_cmd, "export", help="Export a draft: " + FORMAT_HELP)
    add_command(app, import_cmd, "import", help="Import a draft: " + FORMAT_HELP)
