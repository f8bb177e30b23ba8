"""`eaglewire vocab build`, `eaglewire train` and `eaglewire eval`: parse, call, print."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from eaglewire.cli.common import (
    add_command,
    decide_device,
    err_console,
    field_options,
    field_values,
    load_target,
    load_target_weights,
    out_console,
    parse_taps,
    read_samples,
)
from eaglewire.cli.options import (
    DATA_HELP,
    DataOpt,
    DeviceOpt,
    HeldoutFractionOpt,
    JsonOpt,
    LimitOpt,
    MaxLengthOpt,
    SplitTurnsOpt,
    TapsFromOpt,
    TargetOpt,
)
from eaglewire.data.samples import DEFAULT_HELDOUT_FRACTION, DEFAULT_MAX_LENGTH
from eaglewire.errors import EaglewireError, TargetError
from eaglewire.tau import named_tau
from eaglewire.train.config import TrainConfig, knob_fields
from eaglewire.draft.vocab import DEFAULT_DRAFT_VOCAB
from eaglewire.hw import DEVICE_DEFAULT

KNOBS = knob_fields("cli")  # the training knobs that are options of `eaglewire train`
KEEP_FROM_HELP = (
    "Keep this draft's map (a warm start's: "
    "all its head rows are trained) and report its coverage of --data; "
    "a larger --draft-vocab-size adds the most frequent other ids)."
)
VOCAB_HELP = (
    "Vocab map from `vocab build` (EAGLE-3: required; "
    "DFlash: optional, its own head over that vocabulary instead of the "
    "target's full one)."
)
TRAIN_TAPS_HELP = (
    "Online: the taps to capture (default: the family's, "
    "[2, L//2, L-3] for eagle3, z-lab's five for dflash). Offline: read from "
    "the features' manifest; if given, it must agree."
)
TRAIN_LIMIT_HELP = (
    "Train on only the first N training samples of --features (held-out set unchanged): data-scaling experiments."
)
ALSO_FEATURES_HELP = "Extra feature dirs (same taps): every sample trains; held-out comes from --features."
EVAL_DRAFT_HELP = (
    "Draft directory: native checkpoint or any engine export (default: the draft shipped for the embedded target)."
)
EVAL_SPLIT_HELP = (
    "heldout: the split `train` holds out (by conversation "
    "id hash, --heldout-fraction); all: every sample (an evaluation set)."
)


def vocab_build(
    data: DataOpt = ...,
    out: Path = typer.Option(..., "--out", "-o", help="Output vocab map (.safetensors)."),
    target: TargetOpt = None,
    draft_vocab_size: Optional[int] = typer.Option(
        None,
        "--draft-vocab-size",
        help=f"V_d (default {DEFAULT_DRAFT_VOCAB}; with --keep-from, the kept draft's, or larger to grow its map).",
    ),
    max_length: MaxLengthOpt = DEFAULT_MAX_LENGTH,
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N conversations."),
    eval_data: Optional[str] = typer.Option(
        None, "--eval-data", help="Also report coverage on this data (e.g. regenerated MT-bench answers)."
    ),
    split_turns: SplitTurnsOpt = False,
    keep_from: Optional[Path] = typer.Option(None, "--keep-from", help=KEEP_FROM_HELP),
) -> None:
    """Count trained target tokens of the training split (held-out samples, as `train` splits them with the
    default --heldout-fraction, are left out), keep the most frequent, write d2t/t2d, report coverage."""
    from eaglewire.workflows import build_vocab, draft_vocab

    tgt = load_target(target)
    samples = read_samples(tgt, data, max_length, limit, split_turns)
    evals = read_samples(tgt, eval_data, max_length, None, split_turns) if eval_data else None
    keep = draft_vocab(keep_from) if keep_from is not None else None
    default = keep.draft_vocab_size if keep is not None else DEFAULT_DRAFT_VOCAB
    size = draft_vocab_size if draft_vocab_size is not None else default
    built = build_vocab(tgt, samples, size, DEFAULT_HELDOUT_FRACTION, out, data=data, eval_samples=evals, keep=keep)
    out_console.print(
        f"vocab map {built.vmap.sha256()[:16]} -> {out}: V_d={built.vmap.draft_vocab_size} of {tgt.vocab_size}; "
        f"{built.meta['distinct_trained_tokens']} distinct trained tokens; coverage "
        + ", ".join(f"{k} {v:.2%}" for k, v in built.coverage.items())
    )


@field_options(KNOBS)
def train_cmd(
    data: Optional[str] = typer.Option(None, "--data", help=DATA_HELP + " (online mode)."),
    features: Optional[Path] = typer.Option(None, "--features", help="Offline feature dir from `data capture`."),
    vocab: Optional[Path] = typer.Option(None, "--vocab", help=VOCAB_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory: metrics, checkpoints, final draft."),
    target: TargetOpt = None,
    taps: Optional[str] = typer.Option(None, "--taps", help=TRAIN_TAPS_HELP),
    taps_from: TapsFromOpt = "boundary",
    max_length: MaxLengthOpt = DEFAULT_MAX_LENGTH,
    limit: LimitOpt = None,
    heldout_fraction: HeldoutFractionOpt = DEFAULT_HELDOUT_FRACTION,
    train_limit: Optional[int] = typer.Option(None, "--train-limit", help=TRAIN_LIMIT_HELP),
    split_turns: SplitTurnsOpt = False,
    also_features: Optional[list[Path]] = typer.Option(None, "--also-features", help=ALSO_FEATURES_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoints/latest."),
    device: DeviceOpt = DEVICE_DEFAULT,
    **knobs: Any,  # one option per training knob (train/config.py), added by field_options
) -> None:
    """Train a draft: EAGLE-3 with training-time test, or (--family dflash) a DFlash block drafter with the
    block objective (runs under torchrun for DDP)."""
    from eaglewire.api import train_draft
    from eaglewire.train import dist
    from eaglewire.train.objectives import objective as train_objective

    cfg = TrainConfig(**field_values(KNOBS, knobs))
    _refuse_sources(data, features, out, resume)
    objective = train_objective(cfg.family)
    info = dist.setup(decide_device(device))
    tgt, tap_list = _target_and_taps(target, features, taps, taps_from, info.device, objective.default_taps)

    def said(contract: Any, n_train: int, n_heldout: int) -> None:
        err_console.print(
            f"{n_train} training / {n_heldout} held-out samples; taps {list(contract.taps)}; "
            f"contract {contract.fingerprint()}; rank {info.rank}/{info.world_size}"
        )

    summary = train_draft(
        tgt,
        tap_list,
        vocab,
        cfg,
        out,
        features=features,
        heldout_fraction=heldout_fraction,
        samples=lambda: read_samples(tgt, data, max_length, limit, split_turns),
        train_limit=train_limit,
        also_features=also_features,
        info=info,
        resume=resume,
        on_start=said,
        on_step=lambda r: _print_step(r, info.is_main),
    )
    if info.is_main:
        _print_summary(summary, out)
    dist.teardown(info)


def _refuse_sources(data: Optional[str], features: Optional[Path], out: Path, resume: bool) -> None:
    """Exactly one of --data and --features; a fresh run (no --resume) never lands on an earlier one. Checked
    before the minutes of loading."""
    if (data is None) == (features is None):
        raise EaglewireError(
            "give exactly one data source",
            expected="--data (online) or --features (offline)",
            found=f"--data={data}, --features={features}",
        )
    if not resume:
        from eaglewire.train.state import refuse_to_overwrite

        refuse_to_overwrite(out, any_entry=True)


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    """Where the draft went, its held-out top-1 per position and teacher-forced tau, and the curves' file."""
    acc = summary["heldout"].get("acc", [float("nan")])
    tau, rounds = summary["heldout"].get("tau_chain"), summary["heldout"].get("tau_rounds")
    out_console.print(
        f"draft -> {out / 'draft'}; held-out top-1 accuracy per position: "
        + ", ".join(f"{a:.3f}" for a in acc)
        + (
            f"; {named_tau('teacher-forced', tau, 3)} (chain k={len(acc)}) at every position"
            + (f", {rounds:.3f} round by round" if rounds is not None and not math.isnan(rounds) else "")
            if tau is not None
            else ""
        )
        + f"; curves -> {out / 'training.png'}"
    )


def _target_and_taps(
    target: Optional[str],
    features: Optional[Path],
    taps: Optional[str],
    taps_from: str,
    device: str,
    default: Callable[[int], tuple[int, ...]],
) -> tuple[Any, tuple[int, ...]]:
    """Online: the loaded target and --taps (`default(L)`, the family's, when omitted). Offline: the target's config,
    tokenizer and weight index only (the draft's few tensors are read by name; the model is never loaded)
    and the taps of the features' manifest (an explicit --taps must agree)."""
    from eaglewire.capture.features import captured_taps

    if features is None:  # online: the target runs beside the draft, on this rank's device
        tgt = load_target(target, device=device)
        return tgt, parse_taps(tgt, taps, taps_from) if taps else default(tgt.num_layers)
    try:
        tgt = load_target_weights(target)
    except TargetError as err:  # no safetensors, or names only transformers' load-time mapping knows
        err_console.print(f"note: loading the whole target, its tensors cannot be read by name: {err.what}")
        tgt = load_target(target, device=device)
    return tgt, captured_taps(features, parse_taps(tgt, taps, taps_from) if taps else None)


def eval_cmd(
    draft: Optional[Path] = typer.Option(None, "--draft", "-d", help=EVAL_DRAFT_HELP),
    target: TargetOpt = None,
    data: str = typer.Option(
        "smollm2-regen+smollm2-regen-vllm",
        "--data",
        help=DATA_HELP + " Default: the released draft's training data (its held-out split was never trained on).",
    ),
    split: str = typer.Option("heldout", "--split", help=EVAL_SPLIT_HELP),
    heldout_fraction: HeldoutFractionOpt = DEFAULT_HELDOUT_FRACTION,
    samples: int = typer.Option(48, "--samples", help="Samples scored (the first of the split)."),
    positions: int = typer.Option(3, "--positions", help="Drafted positions scored (the chain length)."),
    max_length: MaxLengthOpt = DEFAULT_MAX_LENGTH,
    as_json: JsonOpt = False,
    device: DeviceOpt = DEVICE_DEFAULT,
) -> None:
    """Score a draft offline, as `train` does at each held-out evaluation: teacher-forced top-1 per drafted
    position and the greedy chain's tau, on a data split, without decoding (seconds to minutes)."""
    import json

    import torch

    from eaglewire.compose import load_draft
    from eaglewire.data.samples import split_heldout
    from eaglewire.api import evaluate

    if split not in ("heldout", "all"):
        raise EaglewireError("unknown --split", expected="heldout or all", found=repr(split), fix="--split heldout")
    tgt = load_target(target, device)
    dr = load_draft(draft, tgt, dtype=torch.float32)
    pool = read_samples(tgt, data, max_length, None, False)
    chosen = (split_heldout(pool, heldout_fraction)[1] if split == "heldout" else pool)[:samples]
    r = evaluate(tgt, dr, chosen, positions=positions)
    if as_json:
        print(json.dumps(r, indent=2))
        return
    out_console.print(
        f"{r['samples']} samples ({split}), {r['positions'][0]} answer tokens\n"
        f"top-1 per position {' '.join(f'{a:.3f}' for a in r['acc'])}\n"
        f"chain acceptance   {' '.join(f'{a:.3f}' for a in r['chain'])}\n"
        f"{named_tau('teacher-forced', r['tau_chain'], 3)} at every position, {r['tau_rounds']:.3f} "
        "round by round"
    )


def _print_step(r: dict[str, Any], is_main: bool) -> None:
    if is_main and (r["split"] == "heldout" or r["step"] % 10 == 0):
        acc = " ".join(f"{a:.2f}" for a in r.get("acc", []))
        extra = f" {r['tok_per_s']:.0f} tok/s" if "tok_per_s" in r else ""
        extra += (
            f" {named_tau('teacher-forced', r['tau_chain'], 3)} (rounds {r['tau_rounds']:.3f})"
            if "tau_chain" in r
            else ""
        )
        err_console.print(f"[{r['split']}] step {r['step']} loss {r.get('loss', float('nan')):.3f} acc {acc}{extra}")


def register(app: typer.Typer) -> None:
    vocab_app = typer.Typer(help="The reduced draft vocabulary (d2t/t2d).", no_args_is_help=True)
    add_command(vocab_app, vocab_build, "build")
    app.add_typer(vocab_app, name="vocab")
    add_command(app, train_cmd, "train")
    add_command(app, eval_cmd, "eval")
