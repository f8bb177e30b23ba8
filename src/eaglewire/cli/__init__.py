"""The `eaglewire` command line, one module per command group.

    app.py      the Typer app: global options, registers every group (the console script's `main`)
    common.py   consoles, error formatting applied at registration, target loading, option parsers
    target.py   target info, wiring translate/conventions, capture
    data.py     data regenerate/show/capture        train.py   vocab build, train
    formats.py  export, import                      doctor.py  doctor check/probe/expect/dump-vllm (`doctor DIR` = check)
    decoding.py generate, bench, serve              run.py     run (the whole pipeline)

Each command parses its options, calls one library function and prints. Command modules import only
`common` (never the app), so the import graph is one-way; `python -m eaglewire.cli` runs the app.
This file imports nothing so that importing any command module does not pull in the app.
"""
