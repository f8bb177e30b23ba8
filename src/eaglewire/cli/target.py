"""`eaglewire target info`, `eaglewire wiring translate|conventions`, `eaglewire capture`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from eaglewire.cli.common import CONV_NAMES, add_command, load_target, out_console, parse_ints, parse_taps, styled
from eaglewire.cli.options import DeviceOpt, PrintJsonOpt, TargetOpt
from eaglewire.contract import CANONICAL, CONVENTIONS, default_taps, describe_boundary, from_engine, to_engine
from eaglewire.errors import EaglewireError, TranslationError
from eaglewire.export.engines import ENGINES, SGLANG, block_fields, engine_for
from eaglewire.export.sglang_rules import RELEASES as SGLANG_RELEASES
from eaglewire.export.sglang_rules import used_rules
from eaglewire.families import FAMILIES, get_family, zlab_default_ids
from eaglewire.hw import DEVICE_DEFAULT


def target_info(target: TargetOpt = None, as_json: PrintJsonOpt = False) -> None:
    """Architecture, decoder layers, hidden size, vocab, dtype, tied embeddings, chat template."""
    info = load_target(target).info()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    table = Table(title=f"target {info['name']}", show_header=False)
    for k, v in info.items():
        table.add_row(k, str(v))
    out_console.print(table)


def _rule(name: str, arch: Optional[str], version: Optional[str]) -> tuple[str, str]:
    """(the convention `name` means for this architecture, which SGLang rule that is: "" for fixed ones).
    SGLang without an architecture: every rule its verified releases use (the caller needs them to agree)."""
    if name not in ENGINES or not ENGINES[name].per_model_file:
        return name, ""
    if arch is None:
        return ",".join(used_rules()), f"every SGLang model file eaglewire has read ({', '.join(SGLANG_RELEASES)})"
    record = engine_for(name, version)
    return record.convention_for(arch), record.rule_note(arch)


def _agreed(convert: Any, values: tuple[int, ...], conventions: str, layers: int) -> tuple[int, ...]:
    """`convert(values, c, layers)` for each convention in the comma list; they must agree (portable ids)."""
    out: dict[str, Any] = {}
    for conv in conventions.split(","):
        try:
            out[conv] = convert(values, conv, layers)
        except EaglewireError as err:
            out[conv] = err
    results = set(out.values())
    if len(results) == 1:
        (only,) = results
        if isinstance(only, EaglewireError):
            raise only
        return only
    if all(isinstance(r, EaglewireError) for r in results):
        raise next(iter(out.values()))
    raise TranslationError(
        f"SGLang model files read {list(values)} differently",
        expected="ids every SGLang model file reads the same (taps starting at boundary 2)",
        found="; ".join(f"{c}: {v.what if isinstance(v, EaglewireError) else list(v)}" for c, v in out.items()),
        fix="name the target: --arch ARCH or --target TARGET (and --engine-version V)",
    )


def _translation(
    layers: int, to: str, taps: Optional[str], source: str, arch: Optional[str] = None, version: Optional[str] = None
) -> dict[str, Any]:
    ids_in = parse_ints(taps) if taps is not None else default_taps(layers)
    src, src_note = _rule(source if taps is not None else CANONICAL, arch, version)
    dst, dst_note = _rule(to, arch, version)
    boundaries = _agreed(from_engine, ids_in, src, layers)
    ids_out = _agreed(to_engine, boundaries, dst, layers)
    result: dict[str, Any] = {
        "num_layers": layers,
        "from": src,
        "to": dst,
        "input_ids": list(ids_in),
        "boundaries": list(boundaries),
        "ids": list(ids_out),
        "states": [describe_boundary(b, layers) for b in boundaries],
    }
    result.update({k: v for k, v in (("architecture", arch), ("from_rule", src_note), ("to_rule", dst_note)) if v})
    if dst_note and arch:  # SGLang releases read ids per model file: say where these ids mean other layers
        result["other_releases"] = {}
        for release in SGLANG_RELEASES:
            conv, note = _rule(SGLANG, arch, release)
            try:
                same = from_engine(ids_out, conv, layers) == boundaries
            except EaglewireError:
                same = False
            result["other_releases"][release] = {"rule": note, "same": same}
    return result


def _family_translation(family: str, layers: int, to: str, taps: Optional[str], source: str) -> dict[str, Any]:
    """Every field an engine reads a `family` draft's taps from, with the ids to write there (default taps:
    z-lab's five, `build_target_layer_ids`)."""
    fam = get_family(family)
    all_rows = block_fields(fam.name)
    if not all_rows:
        raise EaglewireError(
            f"the {family} family's ids are one per engine convention",
            expected="--to <convention>",
            found=f"--family {family}",
            fix=f"drop --family (conventions: {CONV_NAMES})",
        )
    ids_in = parse_ints(taps) if taps is not None else zlab_default_ids(layers, 5)
    src = source if taps is not None else "zlab"
    boundaries = from_engine(ids_in, src, layers)
    rows = all_rows if to == "all" else tuple(f for f in all_rows if f.engine == to)
    if not rows:
        raise EaglewireError(
            f"no {to!r} field for the {family} family",
            found=to,
            expected=" / ".join(dict.fromkeys(f.engine for f in all_rows)),
        )
    return {
        "family": family,
        "num_layers": layers,
        "from": src,
        "input_ids": list(ids_in),
        "boundaries": list(boundaries),
        "states": [describe_boundary(b, layers) for b in boundaries],
        "fields": [
            {
                "engine": f.engine,
                "field": f.field,
                "convention": f.convention,
                "ids": list(to_engine(boundaries, f.convention, layers)),
                "note": f.note,
                "source": f.source,
            }
            for f in rows
        ],
    }


def _print_family(result: dict[str, Any]) -> None:
    layers = result["num_layers"]
    table = Table(title=f"{result['family']} taps, L={layers}")
    for col in ("boundary", "physical state", "HF hidden_states index"):
        table.add_column(col)
    for b in result["boundaries"]:
        table.add_row(str(b), describe_boundary(b, layers), str(b) if b < layers else "- (entry L is post-norm)")
    out_console.print(table)
    fields = Table(title="what each engine reads")
    for col in ("engine", "field", "write", "what the engine does with it", "read from"):
        fields.add_column(col)
    for f in result["fields"]:
        fields.add_row(f["engine"], f["field"], str(f["ids"]), f["note"], f["source"])
    out_console.print(fields)
    for f in result["fields"]:
        out_console.print(styled(f"{f['engine']}: {f['field']} = ", (str(f["ids"]), "bold")))


def wiring_translate(
    to: str = typer.Option(
        ...,
        "--to",
        help=f"Convention to write: {CONV_NAMES}, or sglang / sglang-legacy (the "
        "rule of the target's SGLang model file in the newest verified release / the last "
        "before PR #25454: --arch or --target, or ids every model file reads alike).",
    ),
    layers: Optional[int] = typer.Option(
        None, "--layers", "-L", help="Number of decoder layers L of the target (default: --target's)."
    ),
    taps: Optional[str] = typer.Option(
        None,
        "--taps",
        help="Comma-separated ids; default: boundaries [2, L//2, L-3] (the state every engine's default lands on).",
    ),
    source: str = typer.Option(CANONICAL, "--from", help=f"Convention of --taps: {CONV_NAMES}, or sglang."),
    arch: Optional[str] = typer.Option(
        None,
        "--arch",
        help="The target's architecture (config.json "
        "`architectures[0]`): picks SGLang's model file and its layer-id rule.",
    ),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Take --arch and --layers from this target."),
    engine_version: Optional[str] = typer.Option(
        None,
        "--engine-version",
        help=f"SGLang release whose rule applies ({', '.join(SGLANG_RELEASES)}; default: the newest).",
    ),
    as_json: PrintJsonOpt = False,
    family: Optional[str] = typer.Option(
        None,
        "--family",
        help=f"Drafter family ({', '.join(FAMILIES)}): with "
        "it, --to names an engine (vllm, sglang, speculators, zlab, all) and "
        "every field that engine reads is printed; default taps z-lab's five.",
    ),
) -> None:
    """Translate tap ids between engines' layer-id conventions (exit 2 if one cannot express them)."""
    if target is not None:
        ident = load_target(target).identity
        arch, layers = arch or ident.architecture, layers or ident.num_layers
    if layers is None:
        raise EaglewireError(
            "the number of decoder layers is unknown", expected="--layers L or --target", found="neither"
        )
    if family is not None:
        fam = _family_translation(family, layers, to, taps, source)
        print(json.dumps(fam, indent=2)) if as_json else _print_family(fam)
        return
    result = _translation(layers, to, taps, source, arch, engine_version)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    _print_translation(result, to, layers, arch)


def _print_translation(result: dict[str, Any], to: str, layers: int, arch: Optional[str]) -> None:
    """A translation as a table (boundary, state, id), the SGLang rules applied, and the releases it holds for."""
    table = Table(title=f"L={layers}: {result['from']} -> {result['to']}")
    for col in ("boundary", "physical state", f"{to} id"):
        table.add_column(col)
    for b, i in zip(result["boundaries"], result["ids"]):
        table.add_row(str(b), describe_boundary(b, layers), str(i))
    out_console.print(table)
    for k in ("from_rule", "to_rule"):
        if k in result:
            out_console.print(
                f"{k.replace('_', ' ')} applied: {result[k]}" + (f" for {arch}" if arch else ""), highlight=False
            )
    out_console.print(styled(f"{to} ids: ", (str(result["ids"]), "bold")))
    for release, r in result.get("other_releases", {}).items():
        out_console.print(f"{'also valid' if r['same'] else 'NOT valid'} for {r['rule']}", highlight=False)


def wiring_conventions() -> None:
    """List the layer-id conventions eaglewire translates between."""
    table = Table(title="layer-id conventions")
    for col in ("name", "meaning", "embedding (b=0)", "final boundary (b=L)"):
        table.add_column(col)
    for c in CONVENTIONS.values():
        table.add_row(c.name, c.summary, "yes" if c.min_boundary == 0 else "no", "yes" if c.reaches_final else "no")
    out_console.print(table)


def capture_cmd(
    text: str = typer.Option(..., "--text", help="Text to run through the target."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .safetensors file (carries the contract)."),
    target: TargetOpt = None,
    taps: Optional[str] = typer.Option(None, "--taps", help="Comma-separated tap ids (default [2, L//2, L-3])."),
    source: str = typer.Option(CANONICAL, "--taps-from", help=f"Convention of --taps: {CONV_NAMES}."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the text as a user turn with the chat template."),
    logits: bool = typer.Option(False, "--logits", help="Also store the target's logits [1, T, V]."),
    device: DeviceOpt = DEVICE_DEFAULT,
) -> None:
    """Capture the tapped hidden states of one text and write them with the wiring contract."""
    import torch

    from eaglewire.capture.hooks import capture, save_capture

    tgt = load_target(target, device)
    boundaries = parse_taps(tgt, taps, source)
    if chat:
        if tgt.chat_template is None:
            raise EaglewireError(
                "--chat needs a chat template", expected="tokenizer.chat_template", found="none", fix="drop --chat"
            )
        from eaglewire.data.template import chat_ids

        ids = chat_ids(tgt.tokenizer, text)  # [1, P]
    else:
        ids = tgt.tokenizer(text, return_tensors="pt")["input_ids"]
    contract = tgt.contract(boundaries)
    cap = capture(tgt, boundaries, ids, logits=logits)
    save_capture(out, cap, contract, ids)
    per_tap = cap.taps.split(tgt.hidden_size, dim=-1)
    table = Table(title=f"captured {ids.shape[1]} tokens -> {out}")
    for col in ("boundary", "state", "mean", "std"):
        table.add_column(col)
    for b, t in zip(boundaries, per_tap):
        table.add_row(str(b), describe_boundary(b, tgt.num_layers), f"{t.mean():.4f}", f"{t.std():.4f}")
    out_console.print(table)
    out_console.print(
        f"taps {tuple(cap.taps.shape)}  final_hidden {tuple(cap.final_hidden.shape)}  "
        f"contract {contract.fingerprint()}  (dtype {cap.taps.dtype}, torch {torch.__version__})"
    )


def register(app: typer.Typer) -> None:
    target_app = typer.Typer(help="Inspect target models.", no_args_is_help=True)
    wiring_app = typer.Typer(help="Layer-id conventions and the wiring contract.", no_args_is_help=True)
    add_command(target_app, target_info, "info")
    add_command(wiring_app, wiring_translate, "translate")
    add_command(wiring_app, wiring_conventions, "conventions")
    app.add_typer(target_app, name="target")
    app.add_typer(wiring_app, name="wiring")
    add_command(app, capture_cmd, "capture")
