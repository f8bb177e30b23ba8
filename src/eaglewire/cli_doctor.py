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


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
