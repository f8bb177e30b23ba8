"""Every option and argument of every command says what it is in `--help` (and so in the CLI reference)."""

from __future__ import annotations

import typer

from eaglewire.cli.app import app


def test_every_cli_option_has_help_text():
    stack, missing = [("eaglewire", typer.main.get_command(app))], []
    while stack:
        path, cmd = stack.pop()
        missing += [
            f"{path} {'/'.join(p.opts)}"
            for p in cmd.params
            if "--help" not in p.opts and not (getattr(p, "help", None) or "").strip()
        ]
        stack += [(f"{path} {name}", sub) for name, sub in getattr(cmd, "commands", {}).items()]
    assert not missing, f"{len(missing)} options without help: {sorted(missing)}"
