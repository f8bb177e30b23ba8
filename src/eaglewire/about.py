"""What the package is, in the lowest layer: its version (what artifacts record and reports print) and the names of
its front door (`FRONT_DOOR`: `eaglewire.__all__` and `eaglewire.api.__all__` are this one list)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version
FRONT_DOOR = [
    "Generation",
    "Report",
    "TrainConfig",
    "TreeShape",
    "WiringContract",
    "build_vocab",
    "check",
    "decoder",
    "evaluate",
    "export_draft",
    "generate",
    "load_draft",
    "load_target",
    "measure_tau",
    "train_draft",
]
