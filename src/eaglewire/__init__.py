"""eaglewire: train EAGLE-3 drafts, export them with proven wiring, run and measure speculative decoding.

`import eaglewire as ew` gives the Python front door (eaglewire.api): `ew.generate`, `ew.load_target`,
`ew.load_draft`, `ew.check`, `ew.train_draft`, ... Its names load on first use, so `import eaglewire.cli`
(every command's start) does not import torch's models or the doctor until a command needs them.
"""

from eaglewire.about import FRONT_DOOR as _FRONT_DOOR, __version__ as __version__

__all__ = _FRONT_DOOR  # the front door's names, written once (eaglewire/about.py)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `import eaglewire.cli` stays light
if TYPE_CHECKING:  # the names as a type checker and an IDE see them
    from typing import Any

    from eaglewire.api import (
        Generation as Generation,
        Report as Report,
        TrainConfig as TrainConfig,
        TreeShape as TreeShape,
        WiringContract as WiringContract,
        build_vocab as build_vocab,
        check as check,
        decoder as decoder,
        evaluate as evaluate,
        export_draft as export_draft,
        generate as generate,
        load_draft as load_draft,
        load_target as load_target,
        measure_tau as measure_tau,
        train_draft as train_draft,
    )


def __getattr__(name: str) -> "Any":
    """The front door's names, imported from eaglewire.api on first use (PEP 562)."""
    if name in __all__:
        from eaglewire import api

        return getattr(api, name)
    raise AttributeError(f"module 'eaglewire' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*(n for n in globals() if n != "TYPE_CHECKING"), *__all__])
