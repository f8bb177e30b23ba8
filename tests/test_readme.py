"""The README's first commands stay true: CI runs the install and test lines exactly, and the main-job
line is a valid `eaglewire run` invocation (CI runs the same pipeline on a tiny target in test_run.py;
the real quick budget takes ~20 minutes and is measured, not run on every push)."""

import shlex
from pathlib import Path

from typer.testing import CliRunner

from eaglewire.cli.app import app

ROOT = Path(__file__).parents[1]


def _readme_commands() -> list[str]:
    block = ROOT.joinpath("README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readme_install_and_test_commands():
    commands = _readme_commands()
    assert len(commands) == 4
    ci = ROOT.joinpath(".ci", "run").read_text().splitlines()
    for cmd in commands[:2] + commands[3:]:
        assert cmd in ci, f"README command not run by CI: {cmd}"


def test_readme_main_job_is_a_valid_run_command():
    main = shlex.split(_readme_commands()[2])
    assert main[:2] == ["eaglewire", "run"] and "--budget" in main
    r = CliRunner().invoke(app, main[1:] + ["--show-config"])
    assert r.exit_code == 0, r.output
    assert '"conversations"' in r.output


def test_no_third_party_tree_is_tracked():
    """A venv committed by accident (it happened once: 20k files of .venv-specforge) bloats every clone and
    drags other projects' code into our checks. Client venvs live in the user cache instead."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist/wheel install has no history to check)")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    bad = [p for p in tracked.splitlines() if "site-packages/" in p or p.split("/")[0].startswith(".venv")]
    assert not bad, f"{len(bad)} third-party files tracked, e.g. {bad[:3]}"
