"""The empirical wiring check: the doctor's findings from measuring the draft on the target.

What the engine will deliver is read from the draft's config exactly as `layer_ids` reads it (the
engine's id keys and convention, eaglewire.contract for every translation, the engine's default taps
when ids are missing). The candidates beside it are the ways the seeds' drafts were miswired: the same
ids read in every other convention (other engines, other versions), all taps shifted by ±1, the
embedding substituted for the first tap, the default taps; then measure.search walks nearby sets.
"""

from __future__ import annotations

from typing import Callable

import torch

from eaglewire.compose import load_draft
from eaglewire.contract import CANONICAL, CONVENTIONS, WiringContract, default_taps, misnumbered, to_engine
from eaglewire.decoding.tree import TreeShape
from eaglewire.doctor.tap_checks import architecture, decodes, engine_ids
from eaglewire.capture.boundary_file import DumpTarget, require_finite_rows
from eaglewire.doctor.measured_tau import EngineRun, run_engine
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection, detect_engine
from eaglewire.doctor.trained_taps import Measurement, Taps, measure, suspect_adder, wiring_finding
from eaglewire.capture.boundaries import Boundaries, sample_target
from eaglewire.draft.model import Eagle3Draft
from eaglewire.export.engines import Engine
from eaglewire.errors import EaglewireError
from eaglewire.target.protocol import TargetInfo


def delivered_taps(ins: Inspection, L: int, arch: str | None = None) -> tuple[Taps | None, str]:
    """The boundaries the engine will feed the draft, and how the doctor knows."""
    ids, key, _ = engine_ids(ins)
    if ins.engine.hard_coded_taps or ids is None:
        why = "hard-coded" if ins.engine.hard_coded_taps else f"no ids in {ins.engine.id_keys[0]}"
        return (default_taps(L) if L >= 8 else None), f"the {ins.engine.name} default taps ({why})"
    arch = arch or architecture(ins, None)
    try:
        conv, rule = ins.engine.convention_for(arch), ins.engine.rule_note(arch)
    except EaglewireError as err:
        return None, f"{key}={list(ids)}, which {ins.engine.name} cannot read here: {err.what}"
    return decodes(list(ids), conv, L), f"{key}={list(ids)} read by {ins.engine.name}" + (f" ({rule})" if rule else "")


def _own_convention(ins: Inspection, arch: str | None) -> str:
    try:
        return ins.engine.convention_for(arch or architecture(ins, None))
    except EaglewireError:
        return ins.engine.convention


def candidates(
    ins: Inspection, L: int, n: int, arch: str | None = None
) -> tuple[dict[Taps, list[str]], tuple[Taps, ...]]:
    """Tap sets worth scoring, each with why it is a suspect (only sets of the draft's width n), and the
    ones a reading of the config gives (delivered first: measure's tie-break)."""
    delivered, how = delivered_taps(ins, L, arch)
    return candidates_from(delivered, how, engine_ids(ins)[0], _own_convention(ins, arch), L, n)


def candidates_from(
    delivered: Taps | None, how: str, ids: list[int] | None, own: str, L: int, n: int
) -> tuple[dict[Taps, list[str]], tuple[Taps, ...]]:
    """candidates() for any reader of a draft: the delivered set and how it was read, the raw ids, the
    convention `own` they are read in by the engine checked for (a GGUF draft's llama.cpp, say)."""
    out: dict[Taps, list[str]] = {}
    add = suspect_adder(out, n, L)

    add(delivered, f"delivered: {how}")
    if ids:
        for conv in CONVENTIONS:
            if conv not in (CANONICAL, own):
                add(decodes(list(ids), conv, L), f"the ids read in the {conv} convention")
    if L >= 8:
        add(default_taps(L), "the engines' default taps")
    priors = tuple(out)  # what some reading of this config delivers; the perturbations below are not
    if delivered is not None:
        late, early = misnumbered(delivered)
        add(late, "delivered +1")
        add(early, "delivered -1")
        add((0, *delivered[1:]), "the embedding substituted for the first tap")
    return out, priors


def load_for_measure(ins: Inspection, target: TargetInfo, n: int) -> tuple[Eagle3Draft, WiringContract]:
    """The one loader (compose.load_draft) with the measurement's choices: the layout its files are written in
    (not the engine it is checked for), boundaries given (the config's ids are what is under test: the
    contract's taps are a placeholder, its vocab map and norm flags the draft's; the engine run replaces them
    with each set it feeds), fp32 on the CPU."""
    style = (
        "speculators"
        if ins.is_speculators
        else ("eagle3" if "LlamaForCausalLMEagle3" in (ins.config.get("architectures") or []) else "llama")
    )
    # the engine it is checked for reads its config fields its own way (SpecForge's norm_output) when the
    # file is in that engine's style; otherwise the style the file is written in decides
    layout = ins.engine.name if ins.engine.config_style == style else detect_engine(ins.config)
    placeholder = default_taps(target.num_layers) if n == 3 and target.num_layers >= 8 else tuple(range(1, n + 1))
    draft = load_draft(ins.directory, target, fmt=layout, taps=placeholder, dtype=torch.float32)
    return draft.cpu(), draft.contract  # scored on the CPU beside the Boundaries; the engine run moves it


def run_measurement(
    ins: Inspection,
    target: TargetInfo,
    bounds: Boundaries | None = None,
    chain_steps: int = 3,
    shape: TreeShape | None = None,
    progress: Callable[[str], None] = lambda phase: None,
) -> tuple[Measurement | None, list[Finding]]:
    """Measure (capturing the target's boundaries unless given; a DumpTarget brings its own) and turn the
    result into findings. `shape`: the engine's knobs; then our engine also runs on the target with the
    delivered and the best set (measured_tau.py: a generation per tap set, so on request). `progress` is
    told as each phase starts (the capture is the long one: the target generates its greedy answers)."""
    L, H = target.num_layers, target.hidden_size
    fc = ins.shapes.get("fc.weight")
    if fc is None or fc[1] % H:
        return None, [
            Finding(
                "info",
                "measured_wiring",
                "the wiring was not measured: fc does not read whole target states",
                "see the fc finding",
                "fix fc first",
            )
        ]
    n = fc[1] // H
    try:
        draft, contract = load_for_measure(ins, target, n)
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
    arch = architecture(ins, target)
    reasons, priors = candidates(ins, L, n, arch)
    if not reasons:
        return None, [Finding("info", "measured_wiring", f"the wiring was not measured: no {n}-tap candidate", "", "")]
    bounds = boundaries_for(target, bounds, progress)
    progress(f"scoring {len(reasons)} candidate tap sets, then a search around the best")
    # every token the draft embeds is one of the Boundaries' own (measure._normed): a dump's stand-in
    # holds exactly those rows, and a NaN row read anyway would poison every score without a word
    require_finite_rows(draft.embed_tokens.weight, bounds.input_ids, str(ins.directory))
    m = measure(draft, bounds, delivered_taps(ins, L, arch)[0], reasons, chain_steps, priors)
    if shape is not None:
        progress(
            f"our engine decodes the prompts at S={shape.num_steps} K={shape.topk} N={shape.num_draft_tokens} "
            "with the delivered and the best tap sets"
        )
        m.engine = _engine(target, draft, contract, shape, m)
    return m, [finding(m, ins.engine, L, arch)]


def boundaries_for(target: TargetInfo, bounds: Boundaries | None, progress: Callable[[str], None]) -> Boundaries:
    """The boundaries to score on: those given, a dump's own, else every boundary captured on the built-in prompts."""
    if bounds is not None:
        return bounds
    if isinstance(target, DumpTarget):
        return target.bounds
    progress("the target answers the built-in prompts greedily; every boundary is captured (the long phase)")
    return sample_target(target)


def _engine(
    target: TargetInfo, draft: Eagle3Draft, contract: WiringContract, shape: TreeShape, m: Measurement
) -> EngineRun:
    if isinstance(target, DumpTarget):  # decoding needs the target's weights, which a dump does not hold
        return EngineRun(shape, 0, 0, skipped="a boundaries dump holds no target to decode with: use --target")
    return run_engine(target, draft, contract, shape, {"delivered": m.delivered, "best": m.best})


def _fmt(m: Measurement, taps: Taps) -> str:
    s = m.scores[taps]
    return f"{list(taps)}: NLL {s.mean_nll:.2f}, agreement {s.agreement:.2f}"


def _tau(m: Measurement) -> str:
    """The teacher-forced chain's τ, then our engine's at the engine's knobs when it ran."""
    engine = m.engine.text() if m.engine is not None else ""
    if not m.tau:
        return engine
    parts = [f"{k} {v[0]:.2f}" for k, v in sorted(m.tau.items())]
    steps = len(next(iter(m.tau.values()))[1])
    return (
        f"; predicted tau for a {steps}-draft greedy chain, teacher-forced (vLLM num_speculative_tokens="
        f"{steps}, SGLang topk 1): " + ", ".join(parts) + engine
    )


def _fix(m: Measurement, engine: Engine, L: int, arch: str | None = None) -> str:
    if engine.hard_coded_taps:
        return f"{engine.name} hard-codes its taps: serve on sglang or vllm, which read layer ids from the config"
    try:
        ids = list(to_engine(m.best, engine.convention_for(arch), L))
    except EaglewireError as err:
        return f"{engine.name} cannot capture boundaries {list(m.best)} ({err.what}): serve on vllm"
    rule = f", {engine.rule_note(arch)}" if engine.per_model_file else ""
    return f"write {engine.id_keys[0]}: {ids} (boundaries {list(m.best)} in {engine.name}'s numbering{rule}), re-run the doctor"


def finding(m: Measurement, engine: Engine, L: int, arch: str | None = None) -> Finding:
    """error when the delivered set is clearly worse than the best (trained_taps.py's rule), else info."""
    delivered = _fmt(m, m.delivered) if m.delivered is not None else ""
    where = f" ({m.tokens} target tokens, draft vocab covers {m.coverage:.0%}){_tau(m)}"
    return wiring_finding(
        m,
        engine.name,
        f"this draft predicts best from boundaries {_fmt(m, m.best)}",
        delivered,
        where,
        _fix(m, engine, L, arch),
        cannot=f"{engine.name} cannot capture the ids it is given",
    )
