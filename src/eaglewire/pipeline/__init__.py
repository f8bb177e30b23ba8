"""`eaglewire run`: the run config (config.py), the stages (stages.py), their keys and state (runner.py), the report."""
