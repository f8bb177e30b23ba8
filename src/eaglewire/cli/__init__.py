"""The `eaglewire` command line, one module per command group.

    app.py              the Typer app: global options, registers every group (the console script's `main`)
    common.py           consoles, error formatting applied at registration, target loading, option parsers
    options.py          the options several command modules take, each one `Annotated` alias (--target, ...)
    target.py           target info, wiring translate/conventions, capture
    data.py             the data group: show, capture, import, inspect (and data_generation's two)
    data_generation.py  data regenerate/self-prompts: training text the target writes itself
    train.py            vocab build, train, eval
    formats.py          export, import
    doctor.py           doctor check/sample/probe/expect/dump-vllm (`doctor DIR` = check)
    doctor_live.py      doctor live/watch: a running engine
    decoding.py         generate, bench, serve
    run.py              run (the whole pipeline)

Each command parses its options, calls one library function and prints. Command modules import only
`common`, `options` and the modules of their own group's commands (never the app), so the import graph is one-way; `python -m eaglewire.cli` runs the app.
This file imports nothing so that importing any command module does not pull in the app.
"""
