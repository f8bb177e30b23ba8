"""`eaglewire export` / `eaglewire import`: native draft <-> engine layouts, strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.cli.common import add_command, load_target, out_console, parse_dtype, progress

FORMAT_HELP = ("sglang (the layer-id rule of the target's SGLang model file, per release: --engine-version), "
               "vllm / speculators, eagle (SafeAILab), specforge, native (eaglewire's own checkpoint); a DFlash "
               "draft: vllm / speculators, sglang, zlab")
VERSION_HELP = "SGLang release whose per-model-file layer-id rule applies (default: the newest verified)."
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
FORCE_HELP = ("Replace an existing --out that is not an earlier output of this command (its content is deleted); "
              "never the input or a folder holding it.")


def export_cmd(
    draft: Path = typer.Argument(..., help="Native draft checkpoint directory (from `eaglewire train`)."),
    fmt: str = typer.Option(..., "--format", "-f", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="The export's output directory."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Checks the draft belongs to this target."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: as trained)."),
    with_embedding: bool = typer.Option(False, "--with-embedding", help="Also write the (frozen) target embedding."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="vllm/speculators: the target path or hub id "
                                           "vLLM should load (default: the --target path, else its name)."),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help=VERSION_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Write a draft in an engine's layout, plus eaglewire_contract.json (engines ignore it)."""
    import torch

    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.convert import check_out, export_draft
    from eaglewire.export.engines import NATIVE

    check_out(out, fmt, force=force, inputs=(draft,))  # before any loading: refuse an --out it may not replace
    tgt = load_target(target) if target else None
    d = load_checkpoint(draft, target=tgt)
    cast = getattr(torch, parse_dtype(dtype, DTYPES, "--dtype")) if dtype is not None else None
    path = export_draft(d, d.contract, out, fmt, dtype=cast, with_embedding=with_embedding,
                        verifier=verifier or (str(tgt.path) if tgt is not None and tgt.path else None),
                        engine_version=engine_version, force=force, inputs=(draft,))
    ids = "" if fmt == NATIVE else _ids_note(fmt, engine_version, d.contract)
    out_console.print(f"{fmt} export -> {path} ({ids}taps {list(d.contract.taps)})")


def import_cmd(
    directory: Path = typer.Argument(..., help="An exported draft directory."),
    fmt: str = typer.Option(..., "--format", "-f", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Native checkpoint directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Needed when the export has no contract "
                                         "file: the trained boundaries are then measured on it."),
    measure: bool = typer.Option(True, "--measure/--no-measure", help="Without a contract file: measure the "
                                 "trained boundaries (default), or take the config's layer ids as they are."),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help=VERSION_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Read an engine-layout draft strictly into a native checkpoint; a draft from another tool gets a
    contract marked as inferred, with the evidence."""
    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.export.convert import check_out
    from eaglewire.export.engines import ENGINE_FORMATS, engine_for
    from eaglewire.workflows import import_any

    check_out(out, "native", force=force, inputs=(directory,))
    tgt = load_target(target) if target else None
    title = ("importing: no contract file, so the trained boundaries are measured on the target (minutes on a CPU "
             "for a small target; one line per phase)" if tgt is not None and measure else "importing")
    with progress(title) as say:
        d, contract, m = import_any(directory, fmt, tgt, measure=measure, engine_version=engine_version,
                                    progress=say)
    save_checkpoint(d, contract, out, force=force, inputs=(directory,))
    how = {None: "", "measured": "inferred by measurement, ", "engine_config": "inferred from the config's ids, "}
    out_console.print(f"imported {fmt} draft -> {out} (taps {list(contract.taps)}, "
                      f"{how[(contract.inferred or {}).get('source')]}contract {contract.fingerprint()})")
    if m is not None:
        out_console.print(_measured_summary(m), highlight=False)
    # a block drafter's formats (zlab, ...) have no engine record: no per-model-file rule to name
    if fmt in ENGINE_FORMATS and (note := engine_for(fmt, engine_version).rule_note(contract.target.architecture)):
        out_console.print(f"layer ids read by {note} for {contract.target.architecture}", highlight=False)


def _ids_note(fmt: str, version: Optional[str], contract) -> str:
    """"layer ids [...] (the rule that wrote them); " for an export's summary line."""
    from eaglewire.export.block import BLOCK_FORMATS, block_format
    from eaglewire.export.engines import engine_for

    if contract.family in BLOCK_FORMATS:  # a block drafter: its family's format record numbers the ids
        block = block_format(contract.family, fmt)
        return f"{block.ids_at} {list(contract.engine_ids(block.convention))}; "
    record, arch = engine_for(fmt, version), contract.target.architecture
    note = record.rule_note(arch)
    return f"layer ids {list(contract.engine_ids(record.convention_for(arch)))}" + (f" for {note}" if note else "") \
        + "; "


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
