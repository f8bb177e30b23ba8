"""The `eaglewire` Typer app: global options and the registration of every command group.

Errors from eaglewire (EaglewireError) are printed as their what/expected/found/fix message and exit
with code 2, never as a bare stack trace (`common.add_command` applies that to every command).
"""

from __future__ import annotations

import logging

import typer
from rich.logging import RichHandler

from eaglewire.cli import data, decoding, doctor, formats, run, target, train
from eaglewire.cli.common import err_console

app = typer.Typer(help="Train, export, check and run EAGLE-3 draft models.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


@app.callback()
def _setup(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(console=err_console, show_path=False)])
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own status lines replace transformers' tqdm bars


# the order of `eaglewire --help`
for group in (target, formats, doctor, data, train, decoding, run):
    group.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
