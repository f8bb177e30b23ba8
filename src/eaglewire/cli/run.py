"""`eaglewire run`: target -> regenerated data -> vocab -> features -> draft -> exports -> doctor -> bench -> report."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from eaglewire.cli.common import add_command, err_console, load_target, out_console
from eaglewire.hw import DEVICE_HELP
from eaglewire.pipeline.budgets import BUDGETS

RUN_HELP = (
    "One command from a target to a verified, exported, benchmarked draft, with OUT/report.html. "
    "Resumable: run it again with the same arguments to continue; a changed setting redoes only the "
    "stages that depend on it (each stage's outputs live in OUT/work/<stage>-<key>)."
)


def run_cmd(
    target: Optional[str] = typer.Option(
        None,
        "--target",
        "-t",
        help="Local HF model dir (default: the embedded SmolLM2-135M-Instruct). Overrides the config file's target.",
    ),
    out: Path = typer.Option(Path("runs/main"), "--out", "-o", help="Run directory (state, work, report)."),
    budget: str = typer.Option(
        "quick",
        "--budget",
        "-b",
        help=" | ".join(BUDGETS) + ": presets of the run config "
        "(quick: the first run, ~10 min on 2 CPU cores with the embedded target; see README).",
    ),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML/JSON run config; its fields override the budget's (schema: eaglewire.pipeline.config.RunConfig).",
    ),
    family: Optional[str] = typer.Option(
        None,
        "--family",
        "-f",
        help="The drafter family to train: eagle3 (the "
        "default) or dflash (a block drafter; its block knobs: the config file's "
        "family section). Overrides the config file's family.name.",
    ),
    show_config: bool = typer.Option(False, "--show-config", help="Print the resolved config as JSON and exit."),
    device: Optional[str] = typer.Option(
        None, "--device", help=DEVICE_HELP + " Overrides the config file's device (default auto)."
    ),
) -> None:
    from eaglewire.pipeline.config import resolve

    cfg = resolve(budget, config, target=target, family={"name": family} if family is not None else None, device=device)
    if show_config:
        out_console.print_json(json.dumps(cfg.shown()))
        return
    command = _command_line(out, budget, config, target, family)
    summary = _run_with_progress(cfg, out, load_target(cfg.target, cfg.device), command)
    out_console.print(summary["verdict"], highlight=False)
    errors = sum(summary["doctor_errors"].values())
    out_console.print(f"report -> {out / 'report.html'} (also report.md, summary.json); doctor errors: {errors}")
    if errors:
        raise typer.Exit(1)


def _command_line(out: Path, budget: str, config: Optional[Path], target: Optional[str], family: Optional[str]) -> str:
    """The line that ran this run, as the report names it: the options given, not the resolved config."""
    return shlex.join(
        ["eaglewire", "run", "--out", str(out), "--budget", budget]
        + [
            x
            for flag, v in (("--config", config), ("--target", target), ("--family", family))
            if v is not None
            for x in (flag, str(v))
        ]
    )


def _run_with_progress(cfg: Any, out: Path, tgt: Any, command: str) -> dict[str, Any]:
    """The pipeline with a progress bar per stage and one for the whole run (stages done of all)."""
    from eaglewire.pipeline.runner import STAGES, run_pipeline

    cols = [TextColumn("{task.description:<12}"), BarColumn(), TextColumn("{task.fields[detail]}"), TimeElapsedColumn()]
    with Progress(*cols, console=err_console) as bar:
        overall = bar.add_task("run", total=len(STAGES), detail="")
        current: dict[str, int] = {}

        def progress(stage: str, done: float, total: float | None, detail: str) -> None:
            if stage not in current:
                current[stage] = bar.add_task(stage, total=total, detail="")
            bar.update(current[stage], completed=done, total=total, detail=detail)
            finished = sum(1 for t in bar.tasks if t.id != overall and t.finished)
            bar.update(overall, completed=finished, detail=f"stage {stage}")

        return run_pipeline(
            cfg, out, progress=progress, log=lambda s: bar.console.print(s), target=tgt, command=command
        )


def register(app: typer.Typer) -> None:
    add_command(app, run_cmd, "run", help=RUN_HELP)
