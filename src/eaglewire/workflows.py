"""The workflows both the CLI (`eaglewire vocab build`, `eaglewire train`, `eaglewire eval`) and
`eaglewire run` (pipeline/stages.py) call, so the two cannot drift apart: build the draft vocabulary from
the training split, choose the feature source, train a draft and write its summary (`train_draft`, the front
door's too), score a draft offline as training's held-out evaluation does (`eaglewire eval`). A draft from another
tool is imported by the one loader, eaglewire.compose.load_draft, its taps measured by the doctor
(eaglewire.doctor.measures.measured_taps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eaglewire.contract import WiringContract
from eaglewire.errors import EaglewireError
from eaglewire.data.samples import Sample, split_heldout
from eaglewire.train.dist import DistInfo
from eaglewire.train.config import TrainConfig
from eaglewire.draft.vocab import VocabMap
from eaglewire.target.loader import Target
from eaglewire.target.protocol import TargetInfo


@dataclass
class VocabBuild:
    vmap: VocabMap
    counts: torch.Tensor  # int64 [V]: trained-token counts of the training split
    coverage: dict[str, float]  # split name -> share of its trained tokens the draft vocab holds
    meta: dict[str, Any]  # what save_vocab stored beside the map
    train_samples: int
    heldout_samples: int


def build_vocab(
    target: TargetInfo,
    samples: list[Sample],
    draft_vocab_size: int,
    heldout_fraction: float,
    out: Path,
    *,
    data: str,
    eval_samples: list[Sample] | None = None,
    keep: VocabMap | None = None,
) -> VocabBuild:
    """Count the trained tokens of the TRAINING split, keep the most frequent, save the map to `out`.

    Held-out samples are never counted: the held-out coverage (and accuracy) then estimate new prompts
    honestly. `eval_samples` (e.g. MT-bench answers) only report coverage. `keep`: save this map instead
    (a warm start's own vocabulary), with its coverage of these samples, or, if `draft_vocab_size` is
    larger, that map grown by the most frequent other ids."""
    from eaglewire.draft.vocab import build_vocab_map, count_masked_tokens, coverage, grow_vocab_map, save_vocab

    train_s, held = split_heldout(samples, heldout_fraction)
    counts = count_masked_tokens(train_s, target.vocab_size)
    if not int(counts.sum()):  # a map from no tokens would be saved with coverage NaN: refused instead
        raise EaglewireError(
            "no trained token to build the vocabulary from",
            expected=f"samples in the training split (held-out fraction {heldout_fraction:g}) with loss-masked tokens",
            found=f"{len(samples)} samples, {len(train_s)} in the training split, 0 trained tokens",
            fix="pass more data (--data, --limit), or a smaller held-out fraction",
        )
    vmap = build_vocab_map(counts, draft_vocab_size) if keep is None else grow_vocab_map(keep, counts, draft_vocab_size)
    cov = {"train": coverage(vmap, counts)}
    for name, extra in (("held-out", held), ("eval", eval_samples)):
        if extra:
            cov[name] = coverage(vmap, count_masked_tokens(extra, target.vocab_size))
    meta = {
        "target": target.identity.__dict__,
        "data": data,
        "coverage": cov,
        "draft_vocab_size": vmap.draft_vocab_size,
        "distinct_trained_tokens": int((counts > 0).sum()),
        "kept_from_warm_start": keep is not None,
        "kept_ids": keep.draft_vocab_size if keep is not None else 0,
    }
    save_vocab(out, vmap, counts, meta)
    return VocabBuild(vmap, counts, cov, meta, len(train_s), len(held))


def draft_vocab(draft_dir: Path) -> VocabMap:
    """A native draft's own vocabulary map (d2t/t2d read by name, validated): what a warm start keeps."""
    from eaglewire.export.checkpoint import WEIGHTS, read_checkpoint_config
    from eaglewire.errors import CheckpointError
    from eaglewire.safeio import about_file, open_safetensors

    read_checkpoint_config(Path(draft_dir))  # a clear error for anything but a native checkpoint
    with open_safetensors(Path(draft_dir) / WEIGHTS, what="draft weights", error=CheckpointError) as f:
        with about_file(Path(draft_dir) / WEIGHTS):  # the map's own checks name no file
            return VocabMap(d2t=f.get_tensor("d2t"), t2d=f.get_tensor("t2d"))


def feature_source(
    target: Target, contract: WiringContract, features: Path | None, samples: Callable[[], list[Sample]]
) -> tuple[Any, list[Sample]]:
    """Offline features from a `data capture` directory (its samples come with it), else online capture
    of `samples()` through the target."""
    from eaglewire.capture.features import OfflineFeatures, OnlineFeatures

    if features is not None:
        source = OfflineFeatures(features, contract, pad_id=target.pad_id)
        return source, source.samples()
    return OnlineFeatures(target, contract, pad_id=target.pad_id), samples()


def mix_in_features(
    target: Target, contract: WiringContract, primary: Any, extra_dirs: list[Path]
) -> tuple[Any, list[Sample]]:
    """`primary` (offline features) plus extra directories of the same contract, served as one source;
    returns it and the extras' samples (all of them train: held-out comes from the primary only)."""
    from eaglewire.capture.features import FeatureMix, OfflineFeatures

    mix = FeatureMix(primary, [OfflineFeatures(d, contract, pad_id=target.pad_id) for d in extra_dirs])
    return mix, [s for part in range(1, len(mix.parts)) for s in mix.samples(part)]


def train_on_source(
    target: Target,
    contract: WiringContract,
    vmap: VocabMap | None,
    source: Any,
    train_samples: list[Sample],
    heldout: list[Sample],
    cfg: TrainConfig,
    out: Path,
    info: DistInfo = DistInfo(),
    *,
    resume: bool = False,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Training of the contract's family on a feature source already chosen (train_draft's last step) into `out`
    (draft/, checkpoints/, metrics.jsonl, training.png, summary.json on the main rank); returns the summary.
    `vmap`: None for the full vocabulary (DFlash only)."""
    from eaglewire.train.loop import train
    from eaglewire.train.plot import plot_metrics

    last = train(target, contract, vmap, source, train_samples, heldout, cfg, out, info, resume=resume, on_step=on_step)
    summary = {
        "heldout": last,
        "train_samples": len(train_samples),
        "heldout_samples": len(heldout),
        "train_tokens": int(sum(len(s.input_ids) for s in train_samples)),
        "config": cfg.to_dict(),
        "contract": contract.to_dict(),
    }
    if info.is_main:
        plot_metrics(out / "metrics.jsonl", out / "training.png")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def start_draft(
    target: Target, taps: tuple[int, ...], vocab: Path | None, cfg: TrainConfig
) -> tuple[Any, WiringContract]:
    """(draft, contract) as training `cfg` begins it, before its first step: the warm start (cfg.init_from,
    its head rows remapped to this vocab) or the family's fresh initial weights (cfg.seed). What a run's
    report compares the trained draft with."""
    from eaglewire.draft.vocab import load_vocab
    from eaglewire.train.objectives import objective

    vmap = load_vocab(vocab)[0] if vocab is not None else None
    fam = objective(cfg.family)
    contract = fam.make_contract(target, taps, vmap, cfg)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)  # as the trainer seeds before building it (train/loop.py)
        return fam.build_draft(target, contract, vmap, cfg).eval(), contract


def train_draft(
    target: Target,
    taps: Sequence[int] | None,
    vocab: Path | None,
    cfg: TrainConfig,
    out: Path,
    *,
    samples: list[Sample] | Callable[[], list[Sample]] | None = None,
    features: Path | None = None,
    heldout_fraction: float = 0.0,
    train_limit: int | None = None,
    also_features: list[Path] | None = None,
    info: DistInfo = DistInfo(),
    resume: bool = False,
    on_start: Callable[[WiringContract, int, int], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train a draft of `cfg.family` (a TrainConfig: every training knob) for `target` into `out` (draft/,
    checkpoints/, metrics.jsonl, training.png, summary.json); returns the summary, as `eaglewire train` and
    `eaglewire run` do. taps: the boundaries it reads (None: the family's default); vocab: the map file from
    build_vocab (None: the full vocabulary, which DFlash drafts can predict and EAGLE-3 drafts cannot).
    Features: offline from a `data capture` directory `features` (its samples come with it), else `samples`
    (a list, or a function returning it) captured online through the target. The held-out split
    (`heldout_fraction`) is never trained on; `also_features`: more offline directories of the same contract,
    all training. on_start(contract, training samples, held-out samples) hears the split before the first step."""
    from eaglewire.draft.vocab import load_vocab
    from eaglewire.train.objectives import objective

    vmap = load_vocab(vocab)[0] if vocab is not None else None
    family = objective(cfg.family)
    tap_ids = tuple(taps) if taps is not None else family.default_taps(target.num_layers)
    contract = family.make_contract(target, tap_ids, vmap, cfg)
    if features is None and samples is None:
        raise EaglewireError(
            "training needs data",
            expected="samples= (online capture) or features= (a `data capture` directory)",
            found="neither",
            fix="pass samples=[...] or features=DIR",
        )
    read = samples if callable(samples) else (lambda: list(samples or []))
    source, all_samples = feature_source(target, contract, features, read)
    train_samples, heldout = split_heldout(all_samples, heldout_fraction)
    train_samples = train_samples[:train_limit]
    if also_features:
        if features is None:
            raise EaglewireError(
                "--also-features needs --features", expected="a primary feature dir", found="--data (online mode)"
            )
        source, extra = mix_in_features(target, contract, source, also_features)
        train_samples += extra
    if on_start is not None:
        on_start(contract, len(train_samples), len(heldout))
    return train_on_source(
        target, contract, vmap, source, train_samples, heldout, cfg, out, info, resume=resume, on_step=on_step
    )


def evaluate_draft(
    target: Target,
    draft: Any,
    contract: WiringContract,
    samples: list[Sample],
    *,
    positions: int = 3,
    batch_size: int = 4,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """A draft's acceptance measured offline, as `eaglewire train` measures it at each held-out evaluation
    (train.loop.evaluate through the family's objective record, so any family): teacher-forced top-1 per
    drafted position over the answer tokens of `samples`, the greedy chain's tau anchored at every position
    (tau_chain) and walked round by round as a decoder walks it (tau_rounds). fp32 and online features: the
    figures of a draft do not depend on how its training features were stored. `positions`: the chain
    length scored (EAGLE-3's TTT unroll); pad_id: None = the target tokenizer's."""
    import math

    from eaglewire.capture.features import OnlineFeatures
    from eaglewire.train.loop import evaluate
    from eaglewire.train.objectives import objective_for

    if not samples:
        from eaglewire.errors import EaglewireError

        raise EaglewireError(
            "no samples to evaluate the draft on",
            expected="at least one conversation with an answer",
            found="0 samples",
            fix="check the data source, the split and --samples",
        )
    cfg = TrainConfig(
        family=contract.family,
        ttt_steps=positions,
        batch_size=batch_size,
        dtype="fp32",
        eval_batches=math.ceil(len(samples) / batch_size),
    )
    features = OnlineFeatures(target, contract, pad_id=target.pad_id if pad_id is None else pad_id)
    info = DistInfo(device=str(target.device))  # scored where the target runs (its states never leave it)
    model = objective_for(contract).build_model(draft.float().to(info.device), target, None, features, cfg, info).eval()
    return {**evaluate(model, features, samples, cfg, info), "samples": len(samples)}
