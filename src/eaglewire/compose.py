"""Assembling speculative decoding, once: the runtime choice, the cache size, the proposer and the loader
of each drafter family, the τ loop over prompts, and loading any draft directory.

Every surface composes decoding here (the front door eaglewire.api, `generate`, `bench`, `serve`, the
doctor's prediction, the benchmarks), so a fact such as "a verify needs N spare cache slots" or "the
accelerated runtime only where the fastcpu extra is installed" is written once. It sits above the
acceleration layer (it picks it) and below the doctor (which predicts τ with it); eaglewire.api, above
the doctor, adds the check and the training and export verbs.

Where everything runs is decided here too (`device`: hw.pick_device's choice, said once): the target is
loaded there, and the draft and every decoder follow the target (`on_target_device`).

A drafter family's decoding is one `Decoding` record (its proposer, its loader, its default tree), the
"decoding" part of the family's record (families.py), so a second family is one `register` call, not a branch
in every caller: the records, EAGLE-3's and DFlash's, are eaglewire.drafters', read here by `family_of`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from eaglewire import fastcpu
from eaglewire.contract import WiringContract
from eaglewire.decoding.engine import SpecDecoder, SpecStats
from eaglewire.decoding.propose import Proposer
from eaglewire.decoding.runtime import SUPPORTED, Runtime, plain_runtime
from eaglewire.decoding.tree import DEFAULT_TREE, TreeShape

# each family's decoding record (eaglewire.drafters), re-exported: eaglewire.compose is where callers read them
from eaglewire.drafters import DFLASH as DFLASH, EAGLE3 as EAGLE3, Decoding as Decoding, register as register
from eaglewire.drafters import family_of as family_of, proposal_shape as proposal_shape
from eaglewire.export.base import read_contract
from eaglewire.export.block import block_family
from eaglewire.export.checkpoint import FORMAT as NATIVE_FORMAT
from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
from eaglewire.errors import CheckpointError
from eaglewire.export.convert import import_draft
from eaglewire.export.engines import ENGINE_FORMATS, ENGINES, NATIVE, engine_for
from eaglewire.export.llamacpp_layout import GGUF_FILE
from eaglewire.export.llamacpp_layout import STYLE as GGUF_STYLE
from eaglewire.safeio import read_json_object
from eaglewire.target.loader import Target
from eaglewire.target.protocol import TargetInfo

__all__ = [
    "CALIBRATE_MODES",
    "COMPILE_MODES",
    "DFLASH",
    "EAGLE3",
    "Decoding",
    "cache_len",
    "decoder",
    "device",
    "draft_layout",
    "family_of",
    "load_draft",
    "measure_tau",
    "on_target_device",
    "proposal_shape",
    "proposer",
    "register",
    "runtime",
]

COMPILE_MODES = fastcpu.COMPILE_MODES
CALIBRATE_MODES = fastcpu.CALIBRATE_MODES
SPARE_SLOTS = 8  # cache slots beyond the tokens and one verify's nodes: never written, so no view spans all
DEFAULT_PROMPT_TOKENS = 1024  # the prompt room `decoder` sizes for when the caller names no context
Log = Callable[[str], None]
_said: set[str] = set()  # the runtime lines said in this process


class Draft(Protocol):
    """What composition needs of any family's draft: the contract it was trained for."""

    contract: WiringContract | None


# --- where it runs -------------------------------------------------------------------------------------------
def device(choice: str = "auto", log: Log | None = None) -> str:
    """The device every stage of this process runs on (hw.pick_device: cuda when visible, else cpu; `choice`
    from --device or a run config's `device`), said once per process as a command's first line."""
    from eaglewire import hw

    picked = hw.pick_device(choice)
    _say_once(f"device: {hw.describe_device(picked)}", log)  # the same line whoever decides again (a rank)
    return picked


def on_target_device(target: Target, draft: Any) -> Any:
    """`draft` moved to where the target's inputs go (the draft reads the target's taps and embedding there);
    a no-op where it is already there. Every decoder and measurement composes through it."""
    where = target.device
    first = next(iter(draft.parameters()), None) if isinstance(draft, torch.nn.Module) else None
    if first is not None and first.device != where:
        draft.to(where)
    return draft


# --- sizes and the runtime -----------------------------------------------------------------------------------
def cache_len(tokens: int, shape: TreeShape) -> int:
    """KV slots a decoder needs for `tokens` (prompt + new tokens): one verify's N nodes beyond them (the last
    round may verify past the budget) and a few spare. The one margin every surface uses."""
    return tokens + shape.num_draft_tokens + SPARE_SLOTS


def _say_once(line: str, log: Log | None) -> None:
    if line not in _said:
        _said.add(line)
        (log or logging.getLogger("eaglewire").info)(line)


def runtime(
    target: Target,
    max_len: int,
    *,
    accelerate: bool = True,
    calibrate: bool | str = False,
    log: Log | None = None,
    compile: str = "always",
    verify_rows: tuple[int, ...] = (),
) -> Runtime:
    """The runtime `target` decodes on, the one place that decides it. accelerate=False: the plain runtime
    (τ does not depend on how fast the GEMMs run: the doctor, the quality benchmarks). Else the fastest one
    installed here, said once per process: fastcpu's (calibrate / compile / verify_rows go to
    fastcpu.start.make_fast_runtime) where the extra is installed, the plain static-cache runtime where
    not, transformers' own forward for an architecture without a static-cache runtime (the same tokens)."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    if not accelerate:
        return plain_runtime(target, max_len)
    if target.device.type != "cpu":  # fastcpu is the CPU's: a GPU runs torch's own kernels
        _say_once(f"runtime: plain static-cache runtime on {target.device}", log)
        return plain_runtime(target, max_len)
    arch = target.text_config.model_type
    missing = fastcpu.available()
    if arch not in SUPPORTED:
        _say_once(f"runtime: transformers' own forward (model_type {arch!r} has no static-cache runtime)", log)
        return plain_runtime(target, max_len)
    if missing:
        _say_once(f"runtime: plain static-cache runtime ({missing}; the same tokens, slower)", log)
        return plain_runtime(target, max_len)
    from eaglewire.fastcpu.start import make_fast_runtime  # only where the extra is installed

    _say_once("runtime: fastcpu (GEMM layouts calibrated on this machine, compiled graphs)", log)
    return make_fast_runtime(target, max_len, calibrate=calibrate, log=log, compile=compile, verify_rows=verify_rows)


# What a first start costs, from a measured run: `eaglewire run --budget quick` took 423 s the first time (kernels
# built, GEMM layouts calibrated) and 265 s the second (benchmarks/results/run/*-xeon-amx-quick/, Intel
# Xeon, 2 cores); a loaded machine takes longer.
FIRST_START_NOTE = (
    "first start on this machine: the decoding kernels are compiled and the GEMM layouts timed "
    "before the server answers, one to a few minutes on a small CPU (a quick run's first start "
    "took ~160 s longer than its second on a 2-core Xeon); later starts reuse them"
)


def first_start_builds(target: Target, max_len: int) -> bool:
    """Whether `runtime(target, max_len, calibrate=True, compile="always")` compiles kernels now (fastcpu
    installed, the architecture supported, nothing built for it on this machine yet)."""
    if fastcpu.available() is not None or target.text_config.model_type not in SUPPORTED:
        return False
    from eaglewire.fastcpu.start import compiles_on_start

    return compiles_on_start(target, max_len)


def proposer(
    draft: Draft, shape: TreeShape, max_len: int, rt: Runtime, *, contract: WiringContract | None = None
) -> Proposer:
    """The proposer of the draft's family beside runtime `rt`. contract: the wiring to decode with, the
    draft's own by default (the doctor decodes with measured taps instead)."""
    contract = contract if contract is not None else draft.contract
    if contract is None:
        raise ValueError("the draft carries no contract: pass contract=, or load it with load_draft")
    return family_of(contract).proposer(on_target_device(rt.target, draft), contract, shape, max_len, rt)


def decoder(
    target: Target,
    draft: Draft,
    shape: TreeShape = DEFAULT_TREE,
    max_new_tokens: int = 256,
    *,
    context: int | None = None,
    accelerate: bool = True,
    calibrate: bool | str = "cached",
    compile: str = "cached",
    log: Log | None = None,
    contract: WiringContract | None = None,
) -> SpecDecoder:
    """A speculative decoder for `draft` on `target`: `decoder(...).generate(prompt_ids, max_new_tokens)`.
    It owns the runtime choice (`runtime`) and the cache size: room for `context` tokens (prompt + new; by
    default DEFAULT_PROMPT_TOKENS of prompt plus max_new_tokens) and one verify. compile: `eaglewire
    generate --compile`'s (the compiled layouts only where a start on this machine built them already);
    calibrate: its --calibrate (by default the GEMM layouts measured by an earlier start, never a measurement
    before the first token: fastcpu.start.make_fast_runtime)."""
    max_len = cache_len(context if context is not None else DEFAULT_PROMPT_TOKENS + max_new_tokens, shape)
    rt = runtime(
        target,
        max_len,
        accelerate=accelerate,
        calibrate=calibrate,
        log=log,
        compile=compile,
        verify_rows=(shape.num_draft_tokens,),
    )
    return SpecDecoder(rt, proposer(draft, shape, max_len, rt, contract=contract))


def measure_tau(
    target: Target,
    draft: Draft,
    prompts: Sequence[torch.Tensor],
    shape: TreeShape = DEFAULT_TREE,
    max_new_tokens: int = 64,
    *,
    contract: WiringContract | None = None,
    eos: set[int] | None = None,
) -> SpecStats:
    """Greedy speculative decoding of each prompt [1, P] on the plain runtime, the acceptance pooled: `.tau`,
    `.per_position(depth)`. eos: the target tokenizer's EOS by default."""
    if eos is None:
        eos = {target.tokenizer.eos_token_id} if target.tokenizer is not None else set()
    longest = max((int(p.shape[1]) for p in prompts), default=0)
    dec = decoder(
        target,
        draft,
        shape,
        max_new_tokens,
        context=longest + max_new_tokens,
        accelerate=False,
        calibrate=False,
        contract=contract,
    )
    pooled = SpecStats()
    for ids in prompts:
        pooled.accepted += dec.generate(ids, max_new_tokens, eos)[1].accepted
    return pooled


# --- loading any draft directory: the one loader ------------------------------------------------------------
# (directory, layout, target, engine_version) -> (the boundaries the draft was trained on, the evidence): how an
# export that carries no contract gets its taps measured (the doctor's: eaglewire.doctor.measures.measured_taps)
Measure = Callable[[Path, str, TargetInfo, "str | None"], tuple[tuple[int, ...], dict[str, Any]]]
GGUF_ENGINE = next(e.name for e in ENGINES.values() if e.config_style == GGUF_STYLE)  # the layout a .gguf is


def draft_layout(directory: Path) -> str:
    """The layout a draft directory is written in: native (its config names the format), a GGUF (a .gguf file,
    or a directory holding one and no config.json), else the layout the family its contract (or its config's
    architecture) names reads from the config (its decoding record's `layout`)."""
    directory = Path(directory)
    if directory.suffix == ".gguf" or (not (directory / "config.json").is_file() and (directory / GGUF_FILE).is_file()):
        return GGUF_ENGINE
    config = read_json_object(directory / "config.json", what="a draft config")
    if config.get("format") == NATIVE_FORMAT:
        return NATIVE
    if "format" in config and "architectures" not in config:  # a native-looking config of another format: say so
        raise CheckpointError(
            f"{directory / 'config.json'} names format {config['format']!r}",
            expected=f"format {NATIVE_FORMAT!r} (an eaglewire checkpoint) or an engine export's "
            "config (with `architectures`)",
            found=f"format {config['format']!r}",
            fix="point at an eaglewire checkpoint or an exported draft directory",
        )
    side = read_contract(directory)
    family = side.family if side is not None else (block_family(directory / "config.json") or EAGLE3)
    return family_of({"family": family}).layout(config, side)


def load_draft(
    directory: str | Path | None = None,
    target: TargetInfo | None = None,
    *,
    fmt: str | None = None,
    dtype: torch.dtype | None = None,
    engine_version: str | None = None,
    taps: tuple[int, ...] | None = None,
    measure: Measure | None = None,
) -> Any:
    """The one loader: the draft in any directory (None: the draft released for the embedded target), its
    wiring contract inside (`draft.contract`). A native checkpoint, or any engine's export of any family, its
    layout detected (`draft_layout`) unless `fmt` names it; weights read strictly. The contract is the stored
    one; an export without one (another tool's) gets one built on `target` and marked so (`contract.inferred`):
    the boundaries `measure` finds (the doctor's measured_taps), else the config's ids as the engine reads them.
    taps: the caller's boundaries instead (the doctor's measurement feeds each set it scores); neither the
    config's ids nor a side file is then read. dtype: the draft's; None: float32 for a native checkpoint (the
    trainer's), the file's own for an export. engine_version: the release whose layer-id rule reads the ids."""
    directory = resolve_draft(None if directory is None else Path(directory))
    fmt = fmt or draft_layout(directory)
    if fmt == NATIVE:
        if taps is not None:
            raise CheckpointError(
                f"{directory} is a native checkpoint: it carries its contract",
                expected="no boundaries given",
                found=f"taps {list(taps)}",
                fix="given boundaries are for drafts from other tools (engine layouts)",
            )
        draft: Any = load_checkpoint(directory, target=target, dtype=dtype or torch.float32)
        return draft
    evidence = None
    if taps is None and target is not None and read_contract(_contract_home(directory)) is None:
        evidence = _inferred(fmt, target, engine_version)
        if measure is not None:
            taps, found = measure(directory, fmt, target, engine_version)
            evidence = {**evidence, **found, "source": "measured"}
    draft, contract = import_draft(directory, fmt, target=target, taps=taps, engine_version=engine_version)
    if evidence is not None:
        draft.contract = replace(contract, inferred=evidence)  # the evidence travels with it to every export
    return draft if dtype is None else draft.to(dtype)


def _contract_home(path: Path) -> Path:
    """The directory a contract side file sits in (a .gguf file's own)."""
    return path.parent if path.suffix == ".gguf" else path


def _inferred(fmt: str, target: TargetInfo, engine_version: str | None) -> dict[str, Any]:
    """How a contract read from an export's ids was inferred: the engine and, where per model file, its rule."""
    record = engine_for(fmt, engine_version) if fmt in ENGINE_FORMATS else None  # a block format has no record
    note = record.rule_note(target.identity.architecture) if record is not None else ""
    return {"source": "engine_config", "engine": fmt, **({"rule": note} if note else {})}
