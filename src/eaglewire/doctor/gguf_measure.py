"""The doctor's verdict on a GGUF draft: its static findings (gguf_checks.py) and, given the target, the wiring
measured from its weights exactly as for every other format (the same candidates, score and rule:
measured_wiring.candidates_from, trained_taps.measure / wiring_finding; a DFlash GGUF's by the block score of
measured_block.measure_block, as for a DFlash directory), on the GGUF's tensors loaded into our draft model by
`eaglewire import --format llamacpp`'s loader (export/gguf_import.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from eaglewire.capture.boundaries import Boundaries
from eaglewire.capture.boundary_file import require_finite_rows
from eaglewire.compose import GGUF_ENGINE, load_draft
from eaglewire.contract import default_taps
from eaglewire.doctor.tap_checks import decodes
from eaglewire.doctor.findings import Finding, Report, by_level
from eaglewire.doctor.gguf_checks import ENGINE, LLAMACPP, NAME, gguf_findings, right_ids_fix
from eaglewire.doctor.gguf_inspect import GGUFInspection, inspect_gguf
from eaglewire.doctor.measured_block import block_fmt, block_where, measure_block
from eaglewire.doctor.measured_wiring import _fmt, _tau, boundaries_for, candidates_from
from eaglewire.doctor.trained_taps import Measurement, Taps, measure, wiring_finding
from eaglewire.errors import EaglewireError
from eaglewire.export.llamacpp_layout import TARGET_LAYERS
from eaglewire.target.protocol import TargetInfo


def is_gguf(path: Path) -> bool:
    """A .gguf file, or a directory whose draft is one (export --format llamacpp's)."""
    path = Path(path)
    return path.suffix == ".gguf" or (
        path.is_dir() and any(path.glob("*.gguf")) and not (path / "config.json").is_file()
    )


def check_gguf(
    path: Path,
    target: TargetInfo | None = None,
    *,
    target_gguf: Path | None = None,
    measure_it: bool | None = None,
    chain_steps: int = 3,
    progress: Callable[[str], None] = lambda phase: None,
    version: str | None = None,
) -> Report:
    """The doctor on a GGUF draft as llama.cpp loads it; measured on `target` when given (by default where no
    contract file sits beside the GGUF, as for every format). `report.errors` counts the errors."""
    gi = inspect_gguf(path, target, target_gguf, version)
    found: list[Finding] = []
    if target is not None and (measure_it or (measure_it is None and gi.contract is None)):
        gi.measured, found = run_gguf_measurement(gi, target, chain_steps, progress)
    report = Report(str(gi.draft.path), NAME, by_level(gguf_findings(gi) + found))
    report.measurement = gi.measured.to_dict() if gi.measured is not None else None
    return report


def run_gguf_measurement(
    gi: GGUFInspection,
    target: TargetInfo,
    chain_steps: int = 3,
    progress: Callable[[str], None] = lambda phase: None,
    bounds: Boundaries | None = None,
) -> tuple[Measurement | None, list[Finding]]:
    """Score the tap sets a reading of target_layers gives (llama.cpp's, every other numbering, the converter's
    default, ±1, the embedding) with the GGUF's own weights on the target's boundaries (captured on the
    doctor's prompts unless given; a boundaries dump brings its own): a chain drafter's by next-token NLL, a
    block drafter's by teacher-forced block NLL (the family record's `block`), one rule for both."""
    g, L, H = gi.draft, target.num_layers, target.hidden_size
    if not g.family.measured:
        return None, [
            Finding(
                "info",
                "measured_wiring",
                f"the wiring was not measured: no GGUF measurement for the {g.family.family} family yet",
                "its static checks ran",
                "",
            )
        ]
    fc = g.tensor_shapes.get("fc.weight")
    if fc is None or fc[1] % H:
        return None, []  # fc does not read whole target states: the target finding (gguf_checks) names it
    n, ids = fc[1] // H, g.target_layers
    try:
        placeholder = default_taps(L) if n == 3 and L >= 8 else tuple(range(1, n + 1))  # each scored set replaces it
        draft = load_draft(g.path, target, fmt=GGUF_ENGINE, taps=placeholder, dtype=torch.float32)  # the one loader
    except EaglewireError as err:
        return None, [
            Finding(
                "warn",
                "measured_wiring",
                f"the wiring was not measured: the draft does not load ({err.what})",
                "the empirical check runs the draft's own weights",
                err.fix or "",
            )
        ]
    delivered = decodes(ids, LLAMACPP, L) if ids else None
    key = g.family.key(TARGET_LAYERS)
    reasons, priors = candidates_from(delivered, f"{key}={ids} read by {ENGINE}", ids, LLAMACPP, L, n)
    bounds = boundaries_for(target, bounds, progress)
    progress(f"scoring {len(reasons)} candidate tap sets, then a search around the best")
    try:
        m, best, where = (_block if g.family.block else _chain)(
            draft, bounds, delivered, reasons, priors, chain_steps, str(g.path)
        )
    except EaglewireError as err:
        return None, [
            Finding(
                "warn", "measured_wiring", f"the wiring was not measured: {err.what}", err.found or "", err.fix or ""
            )
        ]
    return m, [_wiring(gi, m, best, where, L)]


Scored = tuple[Measurement, Callable[[Measurement, Taps], str], str]  # (measurement, a set's scores as text, where)


def _wiring(
    gi: GGUFInspection, m: Measurement, best: Callable[[Measurement, Taps], str], where: str, L: int
) -> Finding:
    """The measurement's verdict (trained_taps.wiring_finding, the rule every format shares), with the
    target_layers that would deliver the best-scoring taps as its fix."""
    return wiring_finding(
        m,
        ENGINE,
        f"this draft predicts best from boundaries {best(m, m.best)}",
        best(m, m.delivered) if m.delivered is not None else "",
        where,
        right_ids_fix(gi, L, m.best) + ", re-run the doctor",
        cannot=f"{ENGINE} cannot capture the ids it is given",
    )


def _chain(
    draft: Any,
    bounds: Boundaries,
    delivered: Taps | None,
    reasons: dict[Taps, list[str]],
    priors: tuple[Taps, ...],
    chain_steps: int,
    where: str,
) -> Scored:
    """A chain drafter (EAGLE-3): next-token NLL, and the teacher-forced chain's tau."""
    require_finite_rows(draft.embed_tokens.weight, bounds.input_ids, where)
    m = measure(draft, bounds, delivered, reasons, chain_steps, priors)
    return m, _fmt, f" ({m.tokens} target tokens, draft vocab covers {m.coverage:.0%}){_tau(m)}"


def _block(
    draft: Any,
    bounds: Boundaries,
    delivered: Taps | None,
    reasons: dict[Taps, list[str]],
    priors: tuple[Taps, ...],
    chain_steps: int,
    where: str,
) -> Scored:
    """A block drafter (DFlash): the directory measurement's own score, rule and tau (measured_block.py); its
    block's slots are the chain, so `chain_steps` is unused."""
    draft.move_attached("cpu")  # the target's embedding and head, scored on the CPU beside the Boundaries
    m = measure_block(draft, bounds, delivered, reasons, priors, where)
    return m, block_fmt, block_where(m)
