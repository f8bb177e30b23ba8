"""The measured wiring check of each drafter family, one record per family keyed by the name its contract
(or its export's config architecture) carries: callers (`eaglewire doctor check`, `eaglewire import`) ask
`measure_wiring` and never branch on the family."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eaglewire.capture.boundaries import Boundaries
from eaglewire.compose import EAGLE3
from eaglewire.decoding.tree import TreeShape
from eaglewire.doctor.block_inspect import READ_FAMILIES, block_layout
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection, inspect_dir
from eaglewire.doctor.measured_block import run_block_measurement
from eaglewire.doctor.measured_wiring import run_measurement
from eaglewire.doctor.trained_taps import Measurement
from eaglewire.errors import EaglewireError
from eaglewire.export.engines import ENGINE_FORMATS, engine_for
from eaglewire.export.llamacpp_layout import STYLE as GGUF_STYLE
from eaglewire.target.protocol import TargetInfo

Result = tuple[Measurement | None, list[Finding]]
# (inspection, target, engine name or None, bounds or None, chain steps, engine knobs' shape or None, progress)
Run = Callable[[Inspection, Any, str | None, Boundaries | None, int, TreeShape | None, Callable[[str], None]], Result]


@dataclass(frozen=True)
class MeasuredWiring:
    family: str
    run: Run


def _eagle3(
    ins: Inspection,
    target: TargetInfo,
    engine: str | None,
    bounds: Boundaries | None,
    steps: int,
    shape: TreeShape | None,
    progress: Callable[[str], None],
) -> Result:
    return run_measurement(ins, target, bounds, steps, shape, progress)  # the engine is ins.engine's record


# EAGLE-3's, and every block family whose record names a DFlash backbone (DFlash, DSpark): the family record
# (block_inspect.READ_FAMILIES) gives the measurement its anchor layout and the heads it sets aside
MEASURED: dict[str, MeasuredWiring] = {
    m.family: m
    for m in (
        MeasuredWiring(EAGLE3, _eagle3),
        *(
            MeasuredWiring(name, run_block_measurement)
            for name, r in READ_FAMILIES.items()
            if r.backbone_heads is not None
        ),
    )
}


def family_of_dir(ins: Inspection) -> str:
    """The drafter family of an inspected directory: its contract's, else the one its config names."""
    if ins.contract is not None:
        return ins.contract.family
    found = block_layout(ins.config)  # (family, layout) of any block drafter's config the doctor reads
    return found[0] if found is not None else EAGLE3


def measure_wiring(
    ins: Inspection,
    target: TargetInfo,
    *,
    engine: str | None = None,
    bounds: Boundaries | None = None,
    chain_steps: int = 3,
    shape: TreeShape | None = None,
    progress: Callable[[str], None] = lambda phase: None,
) -> Result:
    """The family's measured wiring check: (measurement or None, findings)."""
    family = family_of_dir(ins)
    if family not in MEASURED:
        return None, [
            Finding(
                "info",
                "measured_wiring",
                f"the wiring was not measured: no measurement for the {family} family yet",
                "",
                "",
            )
        ]
    return MEASURED[family].run(ins, target, engine, bounds, chain_steps, shape, progress)


def measured_taps(
    directory: Path,
    fmt: str,
    target: TargetInfo,
    engine_version: str | None = None,
    *,
    bounds: Boundaries | None = None,
    progress: Callable[[str], None] = lambda phase: None,
) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The boundaries an export's own weights predict best on `target` and the evidence (the doctor's empirical
    check; the config's ids win any near-tie): how the one loader infers the contract of a draft from another
    tool (`compose.load_draft(..., measure=measured_taps)`, a compose.Measure). `bounds`: boundaries captured
    already; `progress(phase)` hears each phase of the measurement as it starts."""
    record = engine_for(fmt, engine_version) if fmt in ENGINE_FORMATS else None  # a block format has no record
    if record is not None and record.config_style == GGUF_STYLE:
        raise EaglewireError(
            f"{directory}: measuring a GGUF draft's wiring is not built yet",
            expected="no measurement (the GGUF's target_layers, read in llama.cpp's numbering)",
            found="a GGUF draft without eaglewire_contract.json",
            fix="import with --no-measure",
        )
    ins = inspect_dir(Path(directory), fmt if record else None, engine_version)
    m, findings = measure_wiring(ins, target, engine=fmt, bounds=bounds, progress=progress)
    if m is None:
        raise EaglewireError(
            f"{directory}: the trained boundaries could not be measured",
            found=findings[0].what,
            fix=findings[0].fix or "import with --no-measure to take the config's ids as they are",
        )
    return m.best, {"source": "measured", "target": target.name, **m.to_dict()}
