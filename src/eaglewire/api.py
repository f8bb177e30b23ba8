"""eaglewire from Python: the front door (`import eaglewire as ew`; these names are `eaglewire.__all__`).

    target = ew.load_target()                      # the embedded SmolLM2 target, or a path / hub id
    g = ew.generate(target, None, "Give me three tips.", max_new_tokens=64)  # the released draft; chat template
    print(g.text, g.tau, g.tokens_per_s)           # `eaglewire generate`'s text; a frozen ew.Generation
    ew.train_draft(target, None, "vocab.safetensors", ew.TrainConfig(max_steps=300), "runs/mine", samples=samples)
    ew.export_draft("runs/mine/draft", "runs/export-vllm", "vllm")  # a draft directory, or a loaded draft
    report = ew.check("runs/export-vllm", "vllm", target)  # the doctor, as `eaglewire doctor check` runs it

The command line and `eaglewire run` call these same functions (text generation in eaglewire.generation,
decoding assembled in eaglewire.compose, training and import in eaglewire.workflows): what the CLI does, a
script does with the same code.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable

import torch

from eaglewire.compose import Draft
from eaglewire.compose import decoder as decoder, measure_tau as measure_tau  # re-exported (__all__)
from eaglewire.compose import load_draft as load_draft  # the one loader (re-exported, __all__)
from eaglewire.contract import WiringContract as WiringContract
from eaglewire.decoding.tree import TreeShape as TreeShape
from eaglewire.doctor.block_checks import check_block
from eaglewire.doctor.block_inspect import is_block_dir
from eaglewire.doctor.checks import after_measurement, run_checks
from eaglewire.doctor.findings import Report as Report, by_level
from eaglewire.doctor.gguf_checks import NAME as LLAMACPP
from eaglewire.doctor.gguf_measure import check_gguf, is_gguf
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.doctor.measures import measure_wiring
from eaglewire.errors import EaglewireError
from eaglewire.export.convert import export_draft as _export
from eaglewire.target.loader import Target
from eaglewire.target.loader import load_target as _load_target
from eaglewire.target.protocol import TargetInfo
from eaglewire.data.samples import Sample
from eaglewire.workflows import evaluate_draft
from eaglewire.workflows import build_vocab as build_vocab  # re-exported (__all__)
from eaglewire.workflows import train_draft as train_draft  # re-exported: the CLI's and `eaglewire run`'s training
from eaglewire.generation import Generation as Generation, Prompt
from eaglewire.generation import generate_text
from eaglewire.train.config import TrainConfig as TrainConfig  # re-exported: train_draft's config

# `export` and `train` would be shadowed by the subpackages of those names once imported: hence *_draft
from eaglewire.about import FRONT_DOOR  # noqa: E402

__all__ = FRONT_DOOR  # the one list (eaglewire.__all__ is the same)

# (title) -> a context yielding say(phase): cli/common.py's progress
Progress = Callable[[str], AbstractContextManager[Callable[[str], None]]]


def load_target(spec: str | Path | None = None, *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Target:
    """The target model: None = the embedded SmolLM2-135M (converted into the user cache on first use), else
    a local directory or a hub id already in the local cache. device: 'cpu', 'cuda', 'cuda:N' or 'auto' (cuda
    when visible: eaglewire.compose.device, the command line's --device)."""
    from eaglewire.compose import device as decide

    return _load_target(None if spec is None else str(spec), dtype=dtype, device=decide(device))


def generate(
    target: Target | None,
    draft: Draft | str | Path | None,
    prompt: Prompt,
    max_new_tokens: int = 256,
    *,
    shape: TreeShape | None = None,
    draft_dtype: str = "auto",
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    compile: str = "cached",
    calibrate: str = "cached",
) -> Generation:
    """Text from `prompt` (a user message, or a list of {"role", "content"} chat messages), rendered with the
    target's chat template, decoded speculatively up to `max_new_tokens` new tokens or the EOS: the
    `Generation` (text, tokens, tau, per-position acceptance, timings, tree shape). `eaglewire generate` runs
    the same code (eaglewire.generation.generate_text), so its text is this one. target: a loaded target, or None
    for the embedded one (ew.load_target()). draft: a loaded draft, a draft directory, or None for the draft
    released for the embedded target (the CLI's default --draft); a directory loads through ew.load_draft in
    `draft_dtype` (the CLI's --draft-dtype: auto = bfloat16 where the CPU has native bf16, else the target's).
    shape: the tree verified per round (None: the draft family's default). temperature 0: greedy (plain
    greedy decoding's text); above 0, exact samples of the target's distribution (seeded)."""
    from eaglewire import hw

    tgt = target if target is not None else load_target()
    loaded: Draft = (
        draft
        if draft is not None and not isinstance(draft, (str, Path))
        else load_draft(draft, tgt, dtype=hw.draft_dtype(draft_dtype, tgt.dtype, str(tgt.device)))
    )
    return generate_text(
        tgt,
        loaded,
        prompt,
        max_new_tokens,
        shape=shape,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        compile=compile,
        calibrate=calibrate,
    )


def export_draft(
    draft: Draft | str | Path,
    out: str | Path,
    fmt: str,
    *,
    contract: WiringContract | None = None,
    dtype: torch.dtype | None = None,
    with_embedding: bool | None = None,
    verifier: str | None = None,
) -> Path:
    """Write `draft` (a loaded draft, or a draft directory: ew.load_draft reads it) in layout `fmt` ("sglang",
    "vllm", "eagle", "specforge", "native", ...) with its wiring contract beside it, as `eaglewire export` does;
    the draft's own contract unless `contract` is given."""
    inputs = (Path(draft),) if isinstance(draft, (str, Path)) else ()  # never written over (eaglewire.outputs)
    loaded: Draft = load_draft(draft) if isinstance(draft, (str, Path)) else draft
    contract = contract if contract is not None else loaded.contract
    if contract is None:
        raise ValueError("the draft carries no contract: pass contract=, or load it with load_draft")
    return _export(
        loaded,  # type: ignore[arg-type]
        contract,
        Path(out),
        fmt,
        dtype=dtype,
        with_embedding=with_embedding,
        verifier=verifier,
        inputs=inputs,
    )


def check(
    directory: str | Path,
    engine: str | None = None,
    target: TargetInfo | None = None,
    *,
    measure: bool | None = None,
    steps: int | None = None,
    shape: TreeShape | None = None,
    engine_version: str | None = None,
    progress: Progress | None = None,
    target_gguf: str | Path | None = None,
) -> Report:
    """The doctor on an exported draft as `engine` loads it (None: detected from config.json; `engine_version`:
    the release whose layer-id rule applies, None the newest verified): static checks, and with `target` (a
    loaded target or a boundaries dump's stand-in) the boundaries its weights were trained on, measured (by
    default where the draft has no contract file; always with `shape`, the engine's knobs, at which our engine
    then predicts τ). `report.errors` counts the errors; `progress(title)` wraps the measurement and yields
    `say(phase)`, called as each phase starts. A GGUF draft (a .gguf file, or a directory holding one and no
    config.json) is checked as llama.cpp loads it, against `target_gguf` (the target GGUF) when given."""
    if engine == LLAMACPP or is_gguf(Path(directory)):
        return _check_gguf(Path(directory), engine, target, measure, steps, progress, target_gguf, engine_version)
    block = is_block_dir(Path(directory))
    if block is not None:  # block drafters' static checks are their own (doctor/block_checks.py)
        report: Report = check_block(Path(directory), block, engine, engine_version, target, shape)
        if target is None or measure is False:
            return report
        ins = inspect_dir(Path(directory), engine, engine_version)  # the measurement reads it as for EAGLE-3
    else:
        ins = inspect_dir(Path(directory), engine, engine_version)
        report = run_checks(ins, target)
    if target is None or not (measure or shape is not None or (measure is None and ins.contract is None)):
        return report
    chain = steps if steps is not None else (shape.num_steps if shape is not None else 3)
    with (progress or _quiet)(
        "doctor: measuring the wiring on the target (seconds on a CPU for a small target"
        + (", and our engine decoding at the knobs: tens of seconds" if shape else "")
        + ")"
    ) as say:
        m, found = measure_wiring(ins, target, engine=engine, chain_steps=chain, shape=shape, progress=say)
    report.findings = by_level((after_measurement(report.findings) if m is not None else report.findings) + found)
    report.measurement = m.to_dict() if m is not None else None
    return report


def _check_gguf(
    path: Path,
    engine: str | None,
    target: TargetInfo | None,
    measure: bool | None,
    steps: int | None,
    progress: Progress | None,
    target_gguf: str | Path | None,
    version: str | None,
) -> Report:
    if engine not in (None, LLAMACPP) or not is_gguf(path):
        raise EaglewireError(
            f"{path} is checked as --engine {engine}",
            expected="a GGUF draft with --engine llamacpp (or none), a draft directory with any other engine",
            found=f"{path} with --engine {engine}",
            fix="point --engine llamacpp at the .gguf file, or drop --engine llamacpp for a draft directory",
        )
    if target is None or measure is False:
        return check_gguf(
            path, target, target_gguf=Path(target_gguf) if target_gguf else None, measure_it=False, version=version
        )
    with (progress or _quiet)(
        "doctor: measuring the wiring on the target (seconds on a CPU for a small target)"
    ) as say:
        return check_gguf(
            path,
            target,
            target_gguf=Path(target_gguf) if target_gguf else None,
            measure_it=measure,
            chain_steps=steps or 3,
            progress=say,
            version=version,
        )


def evaluate(
    target: Target, draft: Draft, samples: list[Sample], *, contract: WiringContract | None = None, positions: int = 3
) -> dict[str, Any]:
    """A draft's acceptance on `samples` as `eaglewire eval` and training's held-out evaluations measure it (any
    family): teacher-forced top-1 per drafted position, the greedy chain's tau at every position (`tau_chain`)
    and walked round by round (`tau_rounds`). `contract`: None = the draft's own."""
    wiring = contract if contract is not None else draft.contract
    if wiring is None:
        raise EaglewireError(
            "evaluate needs the draft's wiring contract",
            expected="a draft loaded with its contract (ew.load_draft) or contract=...",
            found="draft.contract is None",
            fix="load the draft with ew.load_draft(DIR, target), or pass contract=",
        )
    return evaluate_draft(target, draft, wiring, samples, positions=positions)


def _quiet(_title: str) -> AbstractContextManager[Callable[[str], None]]:
    return nullcontext(lambda _phase: None)
