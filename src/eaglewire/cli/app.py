"""The `eaglewire` Typer app: global options and the registration of every command group.

Errors from eaglewire (EaglewireError) are printed as their what/expected/found/fix message and exit
with code 2, never as a bare stack trace (`common.add_command` applies that to every command).

Command modules are imported when their command is looked up (`LazyCommands`), not when the app is: an
arithmetic command such as `eaglewire wiring translate` then imports neither torch nor transformers, and
answers in well under a second instead of paying for the training stack's imports.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import click
import typer
import typer.main
from rich.logging import RichHandler
from typer.core import TyperGroup

from eaglewire.cli.common import err_console

# command name -> the cli module whose register() adds it, in the order of `eaglewire --help` (Typer's:
# single commands first, then groups). tests/cli/test_cli_lazy.py checks it against what each module registers.
COMMAND_MODULES: dict[str, str] = {
    "capture": "target",
    "export": "formats",
    "import": "formats",
    "train": "train",
    "eval": "train",
    "generate": "decoding",
    "bench": "decoding",
    "serve": "decoding",
    "run": "run",
    "target": "target",
    "wiring": "target",
    "doctor": "doctor",
    "data": "data",
    "vocab": "train",
}


def module_commands(module: str) -> dict[str, click.Command]:
    """The click commands one cli module registers, built on a Typer of its own."""
    sub = typer.Typer()
    importlib.import_module(f"eaglewire.cli.{module}").register(sub)
    return dict(typer.main.get_group(sub).commands)


class LazyCommands(MutableMapping[str, click.Command]):
    """A click group's `commands`: names known up front, each module imported on first lookup of one of its
    commands. `in` and iteration never import; `[name]`/`.get(name)` import that command's module only."""

    def __init__(self, eager: dict[str, click.Command]) -> None:
        self._loaded = dict(eager)

    def _load(self, name: str) -> None:
        if name in self._loaded:
            return
        # a name not in the table (a typo, or a command a module gained without its row: the test names it)
        # loads every module, so a command that exists is always found
        for module in [COMMAND_MODULES[name]] if name in COMMAND_MODULES else dict.fromkeys(COMMAND_MODULES.values()):
            for n, cmd in module_commands(module).items():
                self._loaded.setdefault(n, cmd)

    def __getitem__(self, name: str) -> click.Command:
        self._load(name)
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in COMMAND_MODULES

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMAND_MODULES, *self._loaded]))

    def __len__(self) -> int:
        return len(set(COMMAND_MODULES) | set(self._loaded))

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        raise TypeError("eaglewire's commands are fixed")


class LazyGroup(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(dict(self.commands))


app = typer.Typer(
    help="Train, export, check and run EAGLE-3 draft models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)


@app.callback()
def _setup(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
    )
    # our own status lines replace transformers' tqdm bars. Importing transformers here would cost about a
    # second on every command; until huggingface_hub is imported, the environment says the same thing.
    if "huggingface_hub" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    else:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"


def main() -> None:
    app()


if __name__ == "__main__":
    main()
