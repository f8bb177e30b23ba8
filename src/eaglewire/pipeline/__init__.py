"""`eaglewire run`: the run config (config.py), the stages (stages.py), their keys and state (runner.py), the report.

The stages call the same workflows as the CLI (eaglewire/workflows.py); the formats a run may export
are the engine records' names (eaglewire/engines.py).
"""
