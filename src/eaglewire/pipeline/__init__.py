"""`eaglewire run`: the whole pipeline from a target to a verified, exported, benchmarked draft.

    config.py     the run config schema (pydantic; `eaglewire run --config`, `--show-config`) and its resolution
    budgets.py    the budget presets (quick|standard|full), each a partial run config
    config_file.py  a --config file read as plain YAML/JSON (size, depth, aliases, tags, duplicate keys refused)
    runner.py     the keyed, resumable stage runner: a stage reruns only when its key changes
    context.py    what every stage is handed (Ctx), and the samples, warm start and draft vocabulary they share
    stages.py     the stages: prompts, regenerate, vocab, features, train, export, doctor, bench
    bench_stage.py  the bench stage: the draft's rows on the bench prompts, τ before -> after training
    report.py     the run report: OUT/summary.json, report.md and report.html, self-contained
    render.py     the report's sections rendered as Markdown and as one self-contained HTML page
    report_bench.py  the benchmark's words in the report: its table, verdict, τ before -> after

The library calls the stages and the CLI share are eaglewire.api's (eaglewire/workflows.py).
The formats a run may export are the engine records' names (export/engines.py).
"""
