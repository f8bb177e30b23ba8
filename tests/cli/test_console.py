"""One printer for anything that came from outside (cli/common.py's consoles): text is printed as it is, never
read as rich markup. A `[/]`, `[bold]x` or `[link=...]` in a value must neither raise MarkupError nor vanish from
the message: checked on the printer with drawn text, and through real error paths of the commands (a file's
content, a config key, a config value, an argument) with drawn markup-looking values."""

import json
import tempfile
from pathlib import Path

import typer
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.cli.common import add_command, err_console, out_console, styled
from eaglewire.errors import EaglewireError

CASES = 30  # generated cases per printer test in CI
CLI_CASES = 8  # generated values through the commands (5 command runs each, no model loaded)

TAGS = [
    "[/]",
    "[bold]",
    "[/bold]",
    "[red]x[/red]",
    "[link=file:///etc]",
    "\\[",
    "[",
    "]",
    "[]",
    "[[/]]",
    "[bold red]error:[/]",
    ":smile:",
    "[@click=app.quit]",
]
markup = st.lists(st.sampled_from(TAGS) | st.text("ab [/]=:\\", max_size=6), min_size=1, max_size=5).map("".join)


def _flat(text: str) -> str:
    """The printed text without rich's line wrapping, for a containment check."""
    return "".join(text.split())


def _fails_with(what: str, expected: str, found: str, fix: str) -> typer.Typer:
    def cmd() -> None:
        raise EaglewireError(what, expected=expected, found=found, fix=fix)

    t = typer.Typer()
    add_command(t, cmd, "x")
    t.command("y")(lambda: None)  # two commands: `x` is a subcommand
    return t


@settings(max_examples=CASES, deadline=None)
@given(parts=st.tuples(markup, markup, markup, markup))
def test_every_error_field_is_printed_as_it_is(parts):
    r = CliRunner().invoke(_fails_with(*parts), ["x"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output and "MarkupError" not in r.output
    assert _flat(str(EaglewireError(parts[0], expected=parts[1], found=parts[2], fix=parts[3]))) in _flat(r.output)


@settings(max_examples=CASES, deadline=None)
@given(value=markup)
def test_the_consoles_never_read_markup_and_styled_styles_only_its_words(value):
    for console in (out_console, err_console):
        with console.capture() as cap:
            console.print(value)
            console.print(styled(("ERROR", "bold red"), " " + value))
        assert _flat(cap.get()) == _flat(value + "ERROR " + value)


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@settings(max_examples=CLI_CASES, deadline=None)
@given(value=markup)
def test_markup_looking_values_reach_the_user_through_the_commands_error_paths(value):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        draft = d / "draft"
        draft.mkdir()
        (draft / "config.json").write_text(json.dumps({"format": value}))  # a file's content
        cfg = d / "run.yaml"
        cfg.write_text(yaml.safe_dump({value: 1}))  # a config key
        cfg2 = d / "run2.yaml"
        cfg2.write_text(yaml.safe_dump({"data": {"engine": value}}))  # a config value
        cases = [
            (("export", str(draft), "--format", "vllm", "--out", str(d / "e")), repr(value)),
            (("run", "--config", str(cfg), "--show-config"), value),
            (("run", "--config", str(cfg2), "--show-config"), repr(value)),
            (("run", "--budget", value, "--show-config"), value),  # an argument
            (("export", str(d / value), "--format", "vllm", "--out", str(d / "e")), str(d / value)),
        ]  # a path
        for args, shown in cases:
            r = _run(*args)
            assert r.exit_code == 2, (args, r.output, r.exception)
            assert "Traceback" not in r.output and "MarkupError" not in r.output, r.output
            assert _flat(shown) in _flat(r.output), (args, shown, r.output)
