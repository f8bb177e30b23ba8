"""Draft checkpoints: eaglewire's native one and the engines' formats (SGLang, vLLM/speculators, SafeAILab
EAGLE, SpecForge), each written and read strictly.

    checkpoint.py  the native checkpoint (model.safetensors + config.json with the contract), the released draft
    engines.py     one record per engine version: how it names, wires and runs a draft (read by the doctor too)
    base.py        strict renaming, the contract side file, atomic export directories
    layouts.py     each engine's config and weight names, written and read from its engines.py record
    convert.py     export_draft / import_draft; imports load through draft/load.py, the native checkpoint's loader
    block.py       block drafters' (DFlash) formats: which layout a config is, and each one written
    block_import.py  a block drafter's export read back strictly (config, semantics, contract, weights)
"""
