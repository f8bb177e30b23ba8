"""The README's first commands are what CI runs (so they stay true)."""

from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_ci_runs_the_readme_commands():
    readme = ROOT.joinpath("README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in readme.splitlines() if line and not line.startswith("#")]
    ci = ROOT.joinpath(".ci", "run").read_text().splitlines()
    assert len(commands) == 4
    for cmd in commands:
        assert cmd in ci, f"README command not run by CI: {cmd}"
