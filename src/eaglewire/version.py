"""eaglewire's version, in the lowest layer: what artifacts record and reports print (the root package re-exports it)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version
