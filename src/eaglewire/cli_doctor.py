"""`eaglewire doctor DRAFT_DIR --target T [--engine E] [--json]`: findings, exit 1 on any error."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eaglewire.doctor.inspect import ENGINES

STYLE = {"error": "bold red", "warn": "yellow", "info": "cyan"}


def doctor_cmd(
    draft: Path = typer.Argument(..., help="An exported draft directory (any engine layout)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="The target it will be served with."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help=f"{', '.join(ENGINES)} (default: detected "
                                         "from config.json; sglang = the PR #25454 layer-id rule)"),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help="Recorded in the report."),
    as_json: bool = typer.Option(False, "--json", help="JSON for CI."),
) -> None:
    """Find silent wiring failures: key names, vocab map, fc width, layer ids, norm flags, target mismatch."""
    from eaglewire import cli

    @cli.friendly
    def run() -> int:
        from eaglewire.doctor.checks import run_checks
        from eaglewire.doctor.inspect import inspect_dir

        tgt = cli._load(target)
        report = run_checks(inspect_dir(draft, engine), tgt)
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


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
