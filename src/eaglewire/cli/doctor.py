"""`eaglewire doctor check|sample|probe|expect|dump-vllm`: findings about a draft's wiring, exit 1 on any error.

`eaglewire doctor DIR ...` is `eaglewire doctor check DIR ...` (the common case keeps its short form):
a first argument that is not a subcommand name (or --help) is taken as check's DRAFT directory. A
draft directory literally named `probe`, `sample`, ... needs the long form `doctor check probe`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from typer.core import TyperGroup

from eaglewire.cli.common import add_command, err_console, load_target, out_console, parse_ints, progress, styled
from eaglewire.cli.options import CiJsonOpt, DeviceOpt, NumDraftTokensOpt, NumStepsOpt, TopkOpt
from eaglewire.export.engines import ENGINES
from eaglewire.errors import EaglewireError
from eaglewire.hw import DEVICE_DEFAULT

STYLE = {"error": "bold red", "warn": "yellow", "info": "cyan"}
# --target of check, probe, expect and dump-vllm: the target the draft will be served with
ServedTargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="The target it will be served with.")]
TARGET_GGUF_HELP = "A GGUF draft's target GGUF (llama-server -m): its sizes and vocabulary against the draft's."
BOUNDARIES_HELP = (
    "A dump of every boundary of the "
    "target from `eaglewire doctor sample` (run where the target runs): "
    "measure on it, no target loaded here. Not with --target."
)
ENGINE_HELP = (
    f"{', '.join(ENGINES)} (default: "
    "detected from config.json, llamacpp for a .gguf; sglang = the layer-id "
    "rule of the target's SGLang model file)"
)
CHECK_VERSION_HELP = (
    "Recorded in the report; for "
    "sglang, the release whose per-model-file layer-id rule applies "
    "(default: the newest verified); for a block drafter (DFlash, "
    "DSpark) the engine release whose rules apply, e.g. vllm "
    "0.30.0 (doctor/block_rules.json)."
)
MEASURE_HELP = (
    "Measure which boundaries the "
    "draft was trained on by running it on the target (default: on when "
    "--target is given and the draft has no eaglewire_contract.json, "
    "always with --boundaries)."
)
STEPS_HELP = (
    "Drafts per round for the teacher-forced tau "
    "of a greedy chain (vLLM num_speculative_tokens; SGLang "
    "--speculative-num-steps at topk 1). Default: the knobs' depth, else 3."
)
CHECK_NUM_STEPS_HELP = (
    "SGLang --speculative-num-steps: with --topk/--num-draft-tokens, our engine predicts tau at this shape."
)
LOG_HELP = "An SGLang/vLLM/llama-server log to read accept lengths from (llama-server's per-position rates need -lv 4)."
EXPECT_VERSION_HELP = (
    "SGLang release whose per-model-file layer-id rule reads an export's ids (default: the newest verified)."
)


class _CheckByDefault(TyperGroup):
    """Routes `doctor DIR ...` to `doctor check DIR ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["check", *args]
        return super().parse_args(ctx, args)


def check_cmd(
    draft: Path = typer.Argument(..., help="An exported draft directory (any engine layout) or a GGUF draft."),
    target: ServedTargetOpt = None,
    target_gguf: Optional[Path] = typer.Option(None, "--target-gguf", help=TARGET_GGUF_HELP),
    boundaries: Optional[Path] = typer.Option(None, "--boundaries", "-b", help=BOUNDARIES_HELP),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help=ENGINE_HELP),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help=CHECK_VERSION_HELP),
    measure: Optional[bool] = typer.Option(None, "--measure/--no-measure", help=MEASURE_HELP),
    steps: Optional[int] = typer.Option(None, "--steps", help=STEPS_HELP),
    num_steps: Optional[int] = typer.Option(None, "--num-steps", help=CHECK_NUM_STEPS_HELP),
    topk: Optional[int] = typer.Option(None, "--topk", help="SGLang --speculative-eagle-topk (> 1: a tree)."),
    num_draft_tokens: NumDraftTokensOpt = None,
    num_speculative_tokens: Optional[int] = typer.Option(
        None, "--num-speculative-tokens", help="vLLM k: our engine predicts tau for this chain."
    ),
    as_json: CiJsonOpt = False,
    device: DeviceOpt = DEVICE_DEFAULT,
) -> None:
    """Find silent wiring failures: key names, vocab map, fc width, layer ids, norm flags, target mismatch,
    and (measured on the target, or on its boundaries dump) the boundaries the draft's weights were trained on.
    Given the engine's knobs, our speculative engine also decodes on the target with the delivered and the
    best boundaries at that shape (tens of seconds per set for a small target on a CPU)."""
    from eaglewire.api import check
    from eaglewire.doctor.geometry import require_default_target_fits, stated_by

    shape = _engine_shape((num_steps, topk, num_draft_tokens, num_speculative_tokens), measure)
    tgt = None if _is_gguf(draft, engine) and target is None else _evidence(target, boundaries, measure, device)
    require_default_target_fits(
        *stated_by(draft), tgt, target_given=target is not None or boundaries is not None, draft=str(draft)
    )
    # a dump is evidence for the measurement; the default target (no --target) is measured only when asked
    asked = True if boundaries is not None else (measure if measure is not None or target is not None else False)
    report = check(
        draft,
        engine,
        tgt,
        measure=asked,
        steps=steps,
        shape=shape,
        engine_version=engine_version,
        progress=progress,
        target_gguf=target_gguf,
    )
    if as_json:
        print(report.to_json())
    else:
        _print_report(report, draft, engine_version, tgt, target_gguf)
    raise typer.Exit(1 if report.errors else 0)


def _print_report(report, draft: Path, engine_version: Optional[str], tgt, target_gguf: Optional[Path]) -> None:
    layout = getattr(report, "layout", "")  # a block drafter's report names its family, layout, version
    out_console.print(
        f"doctor: {draft} as loaded by {report.engine}"
        + (f" {engine_version or report.engine_version}" if engine_version or layout else "")
        + (f" with target {tgt.name}" if tgt is not None else f" with target GGUF {target_gguf}")
        + (f" ({report.family} draft, {layout} layout)" if layout else "")
    )
    for f in report.findings:
        out_console.print(
            styled((f"{f.level.upper():5}", STYLE[f.level]), f" {f.what}\n      why: {f.why}\n      fix: {f.fix}"),
            highlight=False,
        )
    out_console.print(f"{report.errors} error(s), {len(report.findings) - report.errors} other finding(s)")


def _is_gguf(draft: Path, engine: Optional[str]) -> bool:
    """A GGUF draft is checked against --target-gguf: the default HF target is loaded only when named."""
    from eaglewire.doctor.gguf_measure import is_gguf

    return engine == "llamacpp" or is_gguf(draft)


def _engine_shape(knobs: tuple[Optional[int], ...], measure: Optional[bool]) -> Any:
    """The TreeShape the engine's knobs give (None without any). They ask for the measured tau, so they
    measure unless told not to, and are refused with --no-measure rather than silently ignored."""
    if all(k is None for k in knobs):
        return None
    from eaglewire.decoding.tree import TreeShape

    if measure is False:
        raise EaglewireError(
            "engine knobs with --no-measure",
            expected="the knobs shape the measured tau",
            found="--no-measure",
            fix="drop --no-measure, or the knobs",
        )
    return TreeShape.from_knobs(*knobs)


def _evidence(target: Optional[str], boundaries: Optional[Path], measure: Optional[bool], device: str) -> Any:
    """The loaded target (on --device), or the stand-in built from a boundaries dump (one source, never both)."""
    if boundaries is None:
        return load_target(target, device)
    if target is not None:
        raise EaglewireError(
            "--target and --boundaries were both given",
            expected="one source of the target's "
            "states: --target T (loaded and run here) or --boundaries FILE (a dump of it)",
            found=f"--target {target} --boundaries {boundaries}",
            fix="drop --boundaries to measure on the target, or --target to measure on the dump",
        )
    if measure is False:
        raise EaglewireError(
            "--boundaries with --no-measure",
            expected="a dump is evidence for the measured check",
            found="--no-measure",
            fix="drop --no-measure, or --boundaries for the static checks",
        )
    from eaglewire.capture.boundary_file import DumpTarget

    return DumpTarget.from_file(boundaries)


def sample_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="The dump to write (safetensors)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="The target to dump (it is loaded and run)."),
    dtype: str = typer.Option(
        "float32",
        "--dtype",
        help="float32 or bfloat16 (half the file; scores then differ from measuring on the target by bf16 rounding).",
    ),
    vocab: bool = typer.Option(
        False,
        "--vocab",
        help="Also store the target's embedding and output head (2 x "
        "vocab x hidden): block drafters (DFlash) need both to be measured on the dump.",
    ),
) -> None:
    """Dump every residual-stream boundary of the target on the doctor's built-in prompts and its greedy
    answers, for `eaglewire doctor check DRAFT_DIR --boundaries FILE` where the target cannot be loaded.
    Run this where the target does run (the machine that serves it: it is loaded as `--target` loads
    everywhere); the file holds (L+1) x ~1000 positions x hidden floats (~1.7 GiB in float32 for 61 layers
    of 7168)."""
    import torch

    from eaglewire.capture.boundary_file import capture_dump

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise EaglewireError(f"unsupported --dtype {dtype!r}", expected=" or ".join(dtypes), found=dtype)
    tgt = load_target(target)
    with err_console.status("capturing every boundary on the built-in prompts and the target's greedy answers"):
        bounds = capture_dump(tgt, out, dtypes[dtype], vocab=vocab)
    out_console.print(
        f"wrote {out}: boundaries 0..{bounds.num_layers} of {tgt.name} on {int(bounds.scored.sum())} "
        f"scored tokens ({out.stat().st_size / 2**20:.1f} MiB); next: eaglewire doctor check "
        f"DRAFT_DIR --boundaries {out}",
        highlight=False,
    )


def probe_cmd(
    dump: Path = typer.Option(..., "--dump", help="safetensors with `hidden` [T, W] (+ input_ids)."),
    contract_path: Path = typer.Option(
        ..., "--contract", help="eaglewire_contract.json or a draft directory holding one."
    ),
    ids: Optional[str] = typer.Option(None, "--ids", help="Token ids if the dump lacks them."),
    target: ServedTargetOpt = None,
    as_json: CiJsonOpt = False,
) -> None:
    """Name the boundaries an engine delivered to the draft (from a dump of what it fed it)."""
    from eaglewire.contract import WiringContract
    from eaglewire.capture.identify import probe
    from eaglewire.doctor.geometry import require_default_target_fits
    from eaglewire.errors import ContractMismatch
    from eaglewire.export.base import CONTRACT_FILE
    from eaglewire.safeio import read_json_object

    path = contract_path / CONTRACT_FILE if contract_path.is_dir() else contract_path
    contract = WiringContract.from_dict(read_json_object(path, what="a wiring contract", error=ContractMismatch))
    tgt = load_target(target)
    require_default_target_fits(None, contract, tgt, target_given=target is not None, draft=str(contract_path))
    res = probe(tgt, dump, contract, parse_ints(ids) if ids else None)
    if as_json:
        print(json.dumps(dataclasses.asdict(res), indent=2))
    else:
        out_console.print(
            styled(("OK", "green") if res.ok else ("ERROR", "bold red"), " " + res.message), highlight=False
        )
    raise typer.Exit(0 if res.ok else 1)


def _first_turn_prompts(tgt: Any, questions: str, limit: int) -> list[Any]:
    from eaglewire.data.conversations import read_conversations

    convs = [c for _, c in zip(range(limit), read_conversations(questions))]
    from eaglewire.data.template import chat_ids

    return [chat_ids(tgt.tokenizer, c.user_turns[0]) for c in convs]


def expect_cmd(
    draft_dir: Path = typer.Option(..., "--draft", help="The draft (native or any export)."),
    target: ServedTargetOpt = None,
    measured_tau: Optional[float] = typer.Option(None, "--measured-tau", help="The engine's accept length."),
    log: Optional[Path] = typer.Option(None, "--log", help=LOG_HELP),
    num_steps: NumStepsOpt = None,
    topk: TopkOpt = None,
    num_draft_tokens: NumDraftTokensOpt = None,
    num_speculative_tokens: Optional[int] = typer.Option(
        None, "--num-speculative-tokens", help="vLLM k (llama.cpp: --spec-draft-n-max)."
    ),
    questions: str = typer.Option("mtbench", "--questions", help="Prompts (first user turns)."),
    limit: int = typer.Option(4, "--limit", help="Number of prompts."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens per prompt."),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help=EXPECT_VERSION_HELP),
    as_json: CiJsonOpt = False,
) -> None:
    """Predict tau for the engine's knobs; flag a measured tau far below the prediction."""
    from eaglewire.compose import load_draft
    from eaglewire.doctor.expect import judge, parse_log, parse_log_counts, predict, rule_applied
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.doctor.geometry import require_default_target_fits, stated_by

    shape = TreeShape.from_knobs(num_steps, topk, num_draft_tokens, num_speculative_tokens)
    tgt = load_target(target)
    require_default_target_fits(*stated_by(draft_dir), tgt, target_given=target is not None, draft=str(draft_dir))
    draft = load_draft(draft_dir, tgt, engine_version=engine_version)
    contract = draft.contract
    rule = rule_applied(draft_dir, tgt, engine_version)
    prompts = _first_turn_prompts(tgt, questions, limit)
    with progress(
        f"doctor expect: our engine on {len(prompts)} prompts x {max_new_tokens} greedy tokens at "
        f"S{shape.num_steps} K{shape.topk} N{shape.num_draft_tokens} (seconds to a minute a prompt on a "
        "CPU)"
    ) as say:
        tau, per_pos = predict(tgt, draft, contract, shape, prompts, max_new_tokens, progress=say)
    text = log.read_text() if log else ""
    measured = measured_tau if measured_tau is not None else (parse_log(text) if log else None)
    if log is not None and measured is None:
        raise EaglewireError(
            f"no acceptance length found in {log}",
            expected="SGLang 'accept len: X', vLLM 'Mean acceptance length: X' or llama-server 'mean len = X' lines",
            found="none",
        )
    res = judge(tau, per_pos, measured, parse_log_counts(text) if log else None)
    if as_json:
        print(json.dumps({**dataclasses.asdict(res), **({"layer_id_rule": rule} if rule else {})}, indent=2))
    else:
        if rule:
            out_console.print(f"layer ids read by {rule} for {tgt.identity.architecture}", highlight=False)
        out_console.print(styled(("ERROR ", "bold red") if res.flagged else "", res.message), highlight=False)
        out_console.print(f"predicted per-position acceptance: {[round(p, 2) for p in per_pos]}")
        for i, cause in enumerate(res.causes, 1):
            out_console.print(f"  {i}. {cause}", highlight=False)
    raise typer.Exit(1 if res.flagged else 0)


def dump_vllm_cmd(
    draft: Path = typer.Argument(..., help="A vLLM export (its config.json's eagle_aux_hidden_state_layer_ids)."),
    out: Path = typer.Option(..., "--out", "-o", help="The dump to write (safetensors: hidden, input_ids)."),
    target: ServedTargetOpt = None,
    prompt: str = typer.Option("Hello, how are you today?", "--prompt", help="Text, tokenized without a template."),
    ids: Optional[str] = typer.Option(None, "--ids", help="Token ids instead of --prompt."),
    layer_ids: Optional[str] = typer.Option(None, "--layer-ids", help="vLLM ids instead of the config's."),
) -> None:
    """Capture through vLLM's CPU build what it delivers to this draft (its hidden-state extraction at the
    config's ids) and write the dump `doctor probe --dump` names the boundaries of."""
    from transformers import AutoTokenizer

    from eaglewire.doctor.vllm_dump import dump_through_vllm
    from eaglewire.target.loader import resolve_target

    target_dir = resolve_target(target)[1]
    tokens = list(parse_ints(ids)) if ids else AutoTokenizer.from_pretrained(target_dir)(prompt)["input_ids"]
    with err_console.status("vLLM: starting its CPU build (~40 s) and capturing"):
        used = dump_through_vllm(
            target_dir, tokens, out, export_dir=draft, layer_ids=parse_ints(layer_ids) if layer_ids else None
        )
    out_console.print(
        f"wrote {out}: vLLM ids {used} on {len(tokens)} tokens; next: eaglewire doctor probe "
        f"--dump {out} --contract {draft}" + (f" --target {target}" if target else ""),
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    doctor_app = typer.Typer(
        cls=_CheckByDefault,
        no_args_is_help=True,
        help="Check a draft before deployment: `doctor DIR` (= `doctor check DIR`), "
        "`doctor probe` (delivered boundaries), `doctor expect` (predicted vs measured tau), "
        "`doctor dump-vllm` (what vLLM delivers, for probe), `doctor live` / `doctor watch` (a running "
        "engine), `doctor sample` (the target's "
        "boundaries, for `doctor check DIR --boundaries FILE` where the target does not load).",
    )
    add_command(doctor_app, check_cmd, "check")
    add_command(doctor_app, sample_cmd, "sample")
    add_command(doctor_app, probe_cmd, "probe")
    add_command(doctor_app, expect_cmd, "expect")
    add_command(doctor_app, dump_vllm_cmd, "dump-vllm")
    from eaglewire.cli.doctor_live import live_cmd, watch_cmd  # a running engine: its own module

    add_command(doctor_app, live_cmd, "live")
    add_command(doctor_app, watch_cmd, "watch")
    app.add_typer(doctor_app, name="doctor")
