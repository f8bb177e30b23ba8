"""`eaglewire export` / `eaglewire import`: native draft <-> engine layouts, strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from eaglewire.cli.common import add_command, load_target, out_console, parse_dtype, progress
from eaglewire.errors import EaglewireError

FORMAT_HELP = (
    "sglang (the layer-id rule of the target's SGLang model file, per release: --engine-version), "
    "vllm / speculators, eagle (SafeAILab), specforge, llamacpp (a GGUF for llama-server -md), native "
    "(eaglewire's own checkpoint); a DFlash draft: vllm / speculators, sglang, zlab, llamacpp"
)
VERSION_HELP = (
    "SGLang release whose per-model-file layer-id rule applies (default: the newest verified); llamacpp: "
    "the llama-cpp-python version whose llama.cpp serves the draft (default: the newest read)."
)
GGUF_HELP = (
    "llamacpp: the target GGUF llama-server will load with -m; the draft carries its vocabulary (llama-server "
    "refuses a draft whose vocabulary differs). Default: the embedded target's shipped GGUF."
)
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
FORCE_HELP = (
    "Replace an existing --out that is not an earlier output of this command (its content is deleted); "
    "never the input or a folder holding it."
)
EXPORT_DTYPE_HELP = (
    "bf16 | fp16 | fp32 (default: as trained); llamacpp also q8_0 and q4_0 (the 2-D weights; norms stay f32)."
)
VERIFIER_HELP = (
    "vllm/speculators: the target path or hub id vLLM should load (default: the --target path, else its name)."
)
N_MAX_HELP = (
    "llamacpp EAGLE-3: the chain length the printed llama-server line asks for (DFlash: the block's drafts per round)."
)
IMPORT_TARGET_HELP = "Needed when the export has no contract file: the trained boundaries are then measured on it."
IMPORT_MEASURE_HELP = (
    "Without a contract file: measure the trained boundaries (default), or take the config's layer ids as they are."
)

# the options export and import share
FormatOpt = Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)]
EngineVersionOpt = Annotated[Optional[str], typer.Option("--engine-version", help=VERSION_HELP)]
ForceOpt = Annotated[bool, typer.Option("--force", help=FORCE_HELP)]


def export_cmd(
    draft: Path = typer.Argument(..., help="Native draft checkpoint directory (from `eaglewire train`)."),
    fmt: FormatOpt = ...,
    out: Path = typer.Option(..., "--out", "-o", help="The export's output directory."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Checks the draft belongs to this target."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=EXPORT_DTYPE_HELP),
    with_embedding: bool = typer.Option(False, "--with-embedding", help="Also write the (frozen) target embedding."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    engine_version: EngineVersionOpt = None,
    force: ForceOpt = False,
    target_gguf: Optional[Path] = typer.Option(None, "--target-gguf", help=GGUF_HELP),
    n_max: int = typer.Option(3, "--spec-draft-n-max", help=N_MAX_HELP),
) -> None:
    """Write a draft in an engine's layout, plus eaglewire_contract.json (engines ignore it)."""
    import torch

    from eaglewire.compose import load_draft
    from eaglewire.export.convert import check_out, export_draft
    from eaglewire.export.engines import ENGINE_FORMATS, NATIVE, engine_for
    from eaglewire.export.llamacpp_layout import STYLE as GGUF_STYLE

    check_out(out, fmt, force=force, inputs=(draft,))  # before any loading: refuse an --out it may not replace
    gguf = fmt in ENGINE_FORMATS and engine_for(fmt, engine_version).config_style == GGUF_STYLE
    vocab = (target_gguf or _embedded_gguf(target)) if gguf else None  # before loading anything
    tgt = load_target(target) if target else None
    d = load_draft(draft, tgt)
    quant = gguf and dtype in ("q8_0", "q4_0")
    cast = getattr(torch, parse_dtype(dtype, DTYPES, "--dtype")) if dtype is not None and not quant else None
    path = export_draft(
        d,
        d.contract,
        out,
        fmt,
        dtype=cast,
        with_embedding=with_embedding,
        verifier=verifier or (str(tgt.path) if tgt is not None and tgt.path else None),
        engine_version=engine_version,
        force=force,
        inputs=(draft,),
        gguf_dtype=dtype if quant else None,
        vocab_from=vocab,
    )
    ids = "" if fmt == NATIVE else _ids_note(fmt, engine_version, d.contract)
    out_console.print(f"{fmt} export -> {path} ({ids}taps {list(d.contract.taps)})")
    if gguf:
        from eaglewire.export.gguf_draft import server_line

        out_console.print(server_line(d.contract, path, vocab, n_max), highlight=False, soft_wrap=True)


def _embedded_gguf(target: Optional[str]) -> Path:
    """The embedded target's shipped GGUF (llama-server's -m), or a refusal naming --target-gguf."""
    from eaglewire.target.embedded import DEFAULT_TARGET, EMBEDDED, _package_dir

    emb = EMBEDDED.get(target or DEFAULT_TARGET)
    if emb is None:
        raise EaglewireError(
            "a llama.cpp draft needs its target's GGUF",
            expected="--target-gguf TARGET.gguf (the file llama-server loads with -m)",
            found=f"--target {target} and no --target-gguf",
            fix="convert the target with llama.cpp's convert_hf_to_gguf.py and pass that file",
        )
    return _package_dir(emb.package, emb.pip_name) / emb.gguf


def import_cmd(
    directory: Path = typer.Argument(..., help="An exported draft directory."),
    fmt: FormatOpt = ...,
    out: Path = typer.Option(..., "--out", "-o", help="Native checkpoint directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=IMPORT_TARGET_HELP),
    measure: bool = typer.Option(True, "--measure/--no-measure", help=IMPORT_MEASURE_HELP),
    engine_version: EngineVersionOpt = None,
    force: ForceOpt = False,
) -> None:
    """Read an engine-layout draft strictly into a native checkpoint; a draft from another tool gets a
    contract marked as inferred, with the evidence."""
    from functools import partial

    from eaglewire.compose import load_draft
    from eaglewire.doctor.measures import measured_taps
    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.export.convert import check_out
    from eaglewire.export.engines import ENGINE_FORMATS, engine_for

    check_out(out, "native", force=force, inputs=(directory,))
    tgt = load_target(target) if target else None
    title = (
        "importing: no contract file, so the trained boundaries are measured on the target (minutes on a CPU "
        "for a small target; one line per phase)"
        if tgt is not None and measure
        else "importing"
    )
    with progress(title) as say:
        d = load_draft(
            directory,
            tgt,
            fmt=fmt,
            engine_version=engine_version,
            measure=partial(measured_taps, progress=say) if measure else None,
        )
    contract = d.contract
    save_checkpoint(d, contract, out, force=force, inputs=(directory,))
    evidence = contract.inferred or {}
    how = {None: "", "measured": "inferred by measurement, ", "engine_config": "inferred from the config's ids, "}
    out_console.print(
        f"imported {fmt} draft -> {out} (taps {list(contract.taps)}, "
        f"{how[evidence.get('source')]}contract {contract.fingerprint()})"
    )
    if evidence.get("source") == "measured":
        out_console.print(_measured_summary(evidence), highlight=False)
    # a block drafter's formats (zlab, ...) have no engine record: no per-model-file rule to name
    if fmt in ENGINE_FORMATS and (note := engine_for(fmt, engine_version).rule_note(contract.target.architecture)):
        out_console.print(f"layer ids read by {note} for {contract.target.architecture}", highlight=False)


def _ids_note(fmt: str, version: Optional[str], contract) -> str:
    """ "layer ids [...] (the rule that wrote them); " for an export's summary line."""
    from eaglewire.export.block_formats import block_format, is_block_family
    from eaglewire.export.engines import ENGINE_FORMATS, engine_for
    from eaglewire.export.llamacpp_layout import FAMILIES, STYLE, TARGET_LAYERS

    if fmt in ENGINE_FORMATS and (gguf := engine_for(fmt, version)).config_style == STYLE:  # one GGUF per family
        return f"{FAMILIES[contract.family].key(TARGET_LAYERS)} {list(contract.engine_ids(gguf.convention))}; "
    if is_block_family(contract.family):  # a block drafter: its family's format records number the ids
        block = block_format(contract.family, fmt)
        return f"{block.ids_at} {list(contract.engine_ids(block.convention))}; "
    record, arch = engine_for(fmt, version), contract.target.architecture
    note = record.rule_note(arch)
    return (
        f"layer ids {list(contract.engine_ids(record.convention_for(arch)))}" + (f" for {note}" if note else "") + "; "
    )


def _measured_summary(evidence: dict) -> str:
    """The measurement's line, from the evidence the imported contract carries (Measurement.to_dict)."""
    best = next(row for row in evidence["candidates"] if row["taps"] == evidence["best"])
    line = (
        f"measured: the draft predicts best from boundaries {evidence['best']} (NLL {best['nll']:.2f}, "
        f"agreement {best['agreement']:.2f}, {evidence['tokens']} tokens)"
    )
    if evidence["delivered"] != evidence["best"]:
        got = "cannot be captured" if evidence["delivered"] is None else f"deliver {evidence['delivered']}"
        line += f"; the config's ids {got}: the imported contract records {evidence['best']}, and exports write those"
    if evidence["weak_evidence"]:
        line += f"; weak evidence (worst - best = {evidence['spread']:.2f} nats)"
    return line


def register(app: typer.Typer) -> None:
    add_command(app, export_cmd, "export", help="Export a draft: " + FORMAT_HELP)
    add_command(app, import_cmd, "import", help="Import a draft: " + FORMAT_HELP)
