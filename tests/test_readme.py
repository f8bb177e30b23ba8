"""The README's first commands stay true: CI runs the install and test lines exactly, and the main-job
line is a valid `eaglewire run` invocation (CI runs the same pipeline on a tiny target in test_run.py;
the real quick budget takes ~20 minutes and is measured, not run on every push)."""

import json
import re
import shlex
from pathlib import Path

import pytest
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


def _python_example() -> str:
    """The README's Python example: the first python block after "The same from Python"."""
    text = ROOT.joinpath("README.md").read_text()
    return text.split("The same from Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.real_target
def test_the_readme_python_example_prints_what_the_command_prints(capsys):
    """The block runs as a user pastes it (the embedded target, the released draft) and prints the text that
    `eaglewire generate` prints for the same prompt and budget."""
    block = _python_example()
    asked = re.search(r'ew\.generate\(target, None, "([^"]+)", max_new_tokens=(\d+)\)', block)
    assert asked is not None, block
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    r = CliRunner().invoke(app, ["generate", "-p", asked[1], "--max-new-tokens", asked[2], "--json"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    text = json.loads(r.stdout)["text"]
    assert text.strip() and printed == text + "\n"


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


# ------------------------------------------------------------------ every command in the README and the guides

DOC_FILES = [
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "install.md",
    *sorted((ROOT / "docs").glob("guides/*.md")),
    *sorted((ROOT / "docs").glob("concepts/*.md")),
]


def _documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every `eaglewire ...` line of a bash block (also `-m eaglewire.cli ...`)."""
    out = []
    for path in DOC_FILES:
        for block in path.read_text().split("```bash\n")[1:]:
            text = block.split("```", 1)[0].replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split(" #", 1)[0].strip()
                if "-m eaglewire.cli " in line:
                    line = "eaglewire " + line.split("-m eaglewire.cli ", 1)[1]
                if line.startswith("eaglewire "):
                    out.append((path.relative_to(ROOT).as_posix(), line))
    return out


def _resolve(words: list[str]):
    """The click command a documented line runs, and its remaining words."""
    import typer

    cmd = typer.main.get_command(app)
    words = words[1:]
    while hasattr(cmd, "commands"):
        if words and words[0] in cmd.commands:
            cmd, words = cmd.commands[words[0]], words[1:]
        elif "check" in cmd.commands:  # `eaglewire doctor DIR` is `eaglewire doctor check DIR`
            cmd = cmd.commands["check"]
        else:
            raise AssertionError(f"no such command: {words[:1]}")
    return cmd, words


def test_every_documented_command_exists_with_its_options():
    """Each command line in the README and the guides names a real command, and every --option it uses is
    one of that command's options (their full runs take minutes to hours; the main job runs in test_run.py)."""
    commands = _documented_commands()
    assert len(commands) > 40
    for where, line in commands:
        words = shlex.split(line.replace("...", "X"))
        cmd, rest = _resolve(words)
        known = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
        for w in rest:
            if w.startswith("-") and not w.lstrip("-").replace(".", "").isdigit():
                assert w.split("=", 1)[0] in known, f"{where}: `{line}`: {w} is not an option of {cmd.name}"
        r = CliRunner().invoke(app, words[1 : len(words) - len(rest)] + ["--help"])
        assert r.exit_code == 0, f"{where}: `{line}`: --help failed\n{r.output}"


def test_wiring_translations_in_the_docs_are_what_the_cli_prints():
    """The tour's and the taps page's translations are run, not only parsed (they take a second)."""
    for args, expected in (
        (["wiring", "translate", "--layers", "30", "--to", "sglang"], "[1, 14, 26]"),
        (["wiring", "translate", "--layers", "30", "--to", "vllm"], "[2, 15, 27]"),
        (
            ["wiring", "translate", "-L", "30", "--taps", "1,14,26", "--from", "specforge", "--to", "vllm"],
            "[2, 15, 27]",
        ),
    ):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0 and expected in r.output, (args, r.output)
    r = CliRunner().invoke(app, ["wiring", "translate", "-L", "30", "--taps", "0,15,27", "--to", "sglang"])
    assert r.exit_code == 2, r.output
