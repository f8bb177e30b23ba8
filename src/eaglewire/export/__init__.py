"""Draft checkpoint formats of the engines: SGLang, vLLM/speculators, SafeAILab EAGLE, SpecForge.

    base.py      strict renaming, the contract side file, atomic export directories
    layouts.py   each engine's config and weight names, written and read from its record (eaglewire/engines.py)
    convert.py   export_draft / import_draft; imports load through draft/load.py, the native checkpoint's loader
"""
