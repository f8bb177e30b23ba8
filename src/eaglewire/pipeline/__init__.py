"""`eaglewire run`: the whole pipeline from a target to a verified, exported, benchmarked draft.

    config.py     the run config schema (pydantic; `eaglewire run --config`, `--show-config`)
    runner.py     the keyed, resumable stage runner: a stage reruns only when its key changes
    stages.py     the stages: prompts, regenerate, vocab, features, train, export, doctor, bench
    report.py     OUT/report.html, self-contained

The library calls the stages and the CLI share are eaglewire.api's (eaglewire/workflows.py).
The formats a run may export are the engine records' names (export/engines.py).
"""
