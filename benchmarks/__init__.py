"""Reproducible benchmarks, grouped by topic; run from the repository root as modules
(`python -m benchmarks.<topic>.<script>`), writing to benchmarks/results/<topic>/<date>-<cpu>/ (results_dir)."""
