"""`eaglewire doctor DRAFT_DIR --target T [--engine E] [--json]`: findings, exit 1 on any error."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.doctor.inspect import ENGINES

STYLE = {"error": "bold red", "warn": "yellow", "info": "cyan"}


def doctor_cmd(
    draft: str = typer.Argument(..., help="An exported draft directory (any engine layout), or `probe` to "
                                "identify the hidden states an engine delivered (--dump, --contract)."),
    dump: Optional[Path] = typer.Option(None, "--dump", help="probe: safetensors with `hidden` [T, W] (+ input_ids)."),
    contract_path: Optional[Path] = typer.Option(None, "--contract", help="probe: eaglewire_contract.json or a "
                                                 "draft directory holding one."),
    ids: Optional[str] = typer.Option(None, "--ids", help="probe: token ids if the dump lacks them."),
    draft_dir: Optional[Path] = typer.Option(None, "--draft", help="expect: the draft (native or any export)."),
    measured_tau: Optional[float] = typer.Option(None, "--measured-tau", help="expect: the engine's accept length."),
    log: Optional[Path] = typer.Option(None, "--log", help="expect: an SGLang/vLLM log to read accept lengths from."),
    num_steps: Optional[int] = typer.Option(None, "--num-steps", help="expect: SGLang --speculative-num-steps."),
    topk: Optional[int] = typer.Option(None, "--topk", help="expect: SGLang --speculative-eagle-topk."),
    num_draft_tokens: Optional[int] = typer.Option(None, "--num-draft-tokens",
                                                   help="expect: SGLang --speculative-num-draft-tokens (counts the root)."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="expect: vLLM k."),
    questions: str = typer.Option("mtbench", "--questions", help="expect: prompts (first user turns)."),
    limit: int = typer.Option(4, "--limit", help="expect: number of prompts."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="expect: tokens per prompt."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="The target it will be served with."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help=f"{', '.join(ENGINES)} (default: detected "
                                         "from config.json; sglang = the PR #25454 layer-id rule)"),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help="Recorded in the report."),
    as_json: bool = typer.Option(False, "--json", help="JSON for CI."),
) -> None:
    """Find silent wiring failures: key names, vocab map, fc width, layer ids, norm flags, target mismatch.
    `eaglewire doctor probe --dump F --target T --contract C` names the boundaries an engine delivered."""
    from eaglewire import cli

    if draft == "probe":
        raise typer.Exit(_probe(cli, dump, contract_path, target, ids, as_json))
    if draft == "expect":
        from eaglewire.cli_spec import tree_shape

        shape = cli.friendly(tree_shape)(num_steps, topk, num_draft_tokens, num_speculative_tokens)
        raise typer.Exit(_expect(cli, draft_dir, target, shape, questions, limit, max_new_tokens, measured_tau, log,
                                 as_json))

    @cli.friendly
    def run() -> int:
        from eaglewire.doctor.checks import run_checks
        from eaglewire.doctor.inspect import inspect_dir

        tgt = cli._load(target)
        report = run_checks(inspect_dir(Path(draft), engine), tgt)
        if as_json:
            print(report.to_json())
        else:
            cli.out_console.print(f"doctor: {draft} as loaded by {report.engine}"
                                  + (f" {engine_version}" if engine_version else "") + f" with target {tgt.name}")
            for f in report.findings:
                cli.out_console.print(f"[{STYLE[f.level]}]{f.level.upper():5}[/] {f.what}\n"
                                      f"      why: {f.why}\n      fix: {f.fix}", highlight=False)
            cli.out_console.print(f"{report.errors} error(s), {len(report.findings) - report.errors} other finding(s)")
        return 1 if report.errors else 0

    code = run()
    raise typer.Exit(code)


def _probe(cli, dump: Optional[Path], contract_path: Optional[Path], target: Optional[str], ids: Optional[str],
           as_json: bool) -> int:
    @cli.friendly
    def run() -> int:
        import dataclasses
        import json

        from eaglewire.contract import WiringContract
        from eaglewire.doctor.probe import probe
        from eaglewire.errors import EaglewireError
        from eaglewire.formats.base import CONTRACT_FILE

        if dump is None or contract_path is None:
            raise EaglewireError("doctor probe needs --dump and --contract", expected="both", found="missing")
        path = contract_path / CONTRACT_FILE if contract_path.is_dir() else contract_path
        contract = WiringContract.from_json(path.read_text())
        res = probe(cli._load(target), dump, contract, cli.parse_ints(ids) if ids else None)
        if as_json:
            print(json.dumps(dataclasses.asdict(res), indent=2))
        else:
            cli.out_console.print(("[green]OK[/] " if res.ok else "[bold red]ERROR[/] ") + res.message, highlight=False)
        return 0 if res.ok else 1

    return run()


def _expect(cli, draft_dir, target, shape, questions, limit, max_new_tokens, measured_tau, log, as_json) -> int:
    @cli.friendly
    def run() -> int:
        import dataclasses
        import json

        from eaglewire.data.conversations import read_conversations
        from eaglewire.doctor.expect import judge, load_any_draft, parse_log, predict
        from eaglewire.errors import EaglewireError

        if draft_dir is None:
            raise EaglewireError("doctor expect needs --draft", expected="a draft directory", found="none")
        tgt = cli._load(target)
        draft, contract = load_any_draft(draft_dir, tgt)
        convs = [c for _, c in zip(range(limit), read_conversations(questions))]
        prompts = [tgt.tokenizer.apply_chat_template([{"role": "user", "content": c.user_turns[0]}],
                                                     add_generation_prompt=True, return_dict=True,
                                                     return_tensors="pt")["input_ids"] for c in convs]
        tau, per_pos = predict(tgt, draft, contract, shape, prompts, max_new_tokens)
        measured = measured_tau if measured_tau is not None else (parse_log(log.read_text()) if log else None)
        if log is not None and measured is None:
            raise EaglewireError(f"no acceptance length found in {log}", expected="SGLang 'accept len: X' or vLLM "
                                 "'Mean acceptance length: X' lines", found="none")
        res = judge(tau, per_pos, measured)
        if as_json:
            print(json.dumps(dataclasses.asdict(res), indent=2))
        else:
            cli.out_console.print(("[bold red]ERROR[/] " if res.flagged else "") + res.message, highlight=False)
            cli.out_console.print(f"predicted per-position acceptance: {[round(p, 2) for p in per_pos]}")
            for i, cause in enumerate(res.causes, 1):
                cli.out_console.print(f"  {i}. {cause}", highlight=False)
        return 1 if res.flagged else 0

    return run()


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
