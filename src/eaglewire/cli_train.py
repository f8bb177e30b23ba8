"""`eaglewire vocab build`, `eaglewire data capture`, `eaglewire train`: parse, call, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from eaglewire.train.loop import TrainConfig

vocab_app = typer.Typer(help="The reduced draft vocabulary (d2t/t2d).", no_args_is_help=True)
T = TrainConfig()  # the one place the training defaults live
from eaglewire.data.samples import DEFAULT_HELDOUT_FRACTION, DEFAULT_MAX_LENGTH
from eaglewire.vocab import DEFAULT_DRAFT_VOCAB
DATA_HELP = "Regenerated conversations (.jsonl.gz from `data regenerate`) or any conversation file."


def _cli():
    from eaglewire import cli

    return cli


def prepare_samples(target: Any, data: str, max_length: int, limit: Optional[int], split_turns: bool):
    from eaglewire.data.conversations import ReadStats
    from eaglewire.data.samples import load_samples

    read = ReadStats()
    samples, stats = load_samples(data, target.tokenizer, max_length=max_length, limit=limit, split_turns=split_turns,
                                  read_stats=read)
    _cli().err_console.print(f"source: {read.summary()}\ndata: {stats.summary()}")
    return samples


def _taps(target: Any, taps: Optional[str], source: str) -> tuple[int, ...]:
    from eaglewire.contract import default_taps, from_engine

    cli = _cli()
    return from_engine(cli.parse_ints(taps), source, target.num_layers) if taps else default_taps(target.num_layers)


@vocab_app.command("build")
def vocab_build(
    data: str = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Output vocab map (.safetensors)."),
    target: Optional[str] = typer.Option(None, "--target", "-t"),
    draft_vocab_size: int = typer.Option(DEFAULT_DRAFT_VOCAB, "--draft-vocab-size"),
    max_length: int = typer.Option(DEFAULT_MAX_LENGTH, "--max-length"),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N conversations."),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Also report coverage on this data "
                                            "(e.g. regenerated MT-bench answers)."),
    split_turns: bool = typer.Option(False, "--split-turns"),
) -> None:
    """Count trained target tokens, keep the most frequent, write d2t/t2d, report coverage."""
    cli = _cli()

    @cli.friendly
    def run() -> None:
        from eaglewire.vocab import build_vocab_map, count_masked_tokens, coverage, save_vocab

        tgt = cli._load(target)
        counts = count_masked_tokens(prepare_samples(tgt, data, max_length, limit, split_turns), tgt.vocab_size)
        vmap = build_vocab_map(counts, draft_vocab_size)
        cov = {"train": coverage(vmap, counts)}
        if eval_data:
            ev = count_masked_tokens(prepare_samples(tgt, eval_data, max_length, None, split_turns), tgt.vocab_size)
            cov["eval"] = coverage(vmap, ev)
        meta = {"target": tgt.identity.__dict__, "data": data, "coverage": cov, "draft_vocab_size": draft_vocab_size,
                "distinct_trained_tokens": int((counts > 0).sum())}
        save_vocab(out, vmap, counts, meta)
        cli.out_console.print(f"vocab map {vmap.sha256()[:16]} -> {out}: V_d={draft_vocab_size} of {tgt.vocab_size}; "
                              f"{meta['distinct_trained_tokens']} distinct trained tokens; coverage " +
                              ", ".join(f"{k} {v:.2%}" for k, v in cov.items()))

    run()


def capture_cmd(
    data: str = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Feature directory (resumes if it exists)."),
    target: Optional[str] = typer.Option(None, "--target", "-t"),
    taps: Optional[str] = typer.Option(None, "--taps", help="Tap ids (default boundaries [2, L//2, L-3])."),
    taps_from: str = typer.Option("boundary", "--taps-from"),
    max_length: int = typer.Option(DEFAULT_MAX_LENGTH, "--max-length"),
    limit: Optional[int] = typer.Option(None, "--limit"),
    shard_samples: int = typer.Option(256, "--shard-samples"),
    batch_size: int = typer.Option(4, "--batch-size"),
    split_turns: bool = typer.Option(False, "--split-turns"),
    target_dtype: str = typer.Option("float32", "--target-dtype", help="Run the target in float32 or bfloat16 "
                                     "(AVX512-BF16/AMX CPUs: ~3x faster; taps within ~0.5%, top-1 agrees 99%)."),
    store_dtype: str = typer.Option("bfloat16", "--store-dtype", help="bfloat16 (4.6 KB/token for 3 taps of 576) "
                                    "or float32 (twice that) for the stored taps and final state."),
) -> None:
    """Capture tapped target states for training into resumable safetensors shards + manifest."""
    cli = _cli()

    @cli.friendly
    def run() -> None:
        import torch
        from rich.progress import Progress

        from eaglewire.data.features import capture_features

        from eaglewire.target.loader import load_target

        for name in (store_dtype, target_dtype):
            if name not in ("bfloat16", "float32"):
                raise cli.EaglewireError("unknown dtype", expected="bfloat16 or float32", found=name)
        tgt = load_target(target, dtype=getattr(torch, target_dtype))
        samples = prepare_samples(tgt, data, max_length, limit, split_turns)
        contract = tgt.contract(_taps(tgt, taps, taps_from))
        with Progress(console=cli.err_console) as progress:
            task = progress.add_task("capturing shards", total=None)
            manifest = capture_features(tgt, contract, samples, out, pad_id=_pad_id(tgt), shard_samples=shard_samples,
                                        batch_size=batch_size, dtype=getattr(torch, store_dtype),
                                        on_shard=lambda k, n, _t: progress.update(task, completed=k, total=n))
        cli.out_console.print(f"{manifest['samples']} samples, {manifest['tokens']} tokens in "
                              f"{len(manifest['shards'])} shards -> {out} (contract {contract.fingerprint()})")

    run()


def _pad_id(target: Any) -> int:
    tok = target.tokenizer
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def train_cmd(
    data: Optional[str] = typer.Option(None, "--data", help=DATA_HELP + " (online mode)."),
    features: Optional[Path] = typer.Option(None, "--features", help="Offline feature dir from `data capture`."),
    vocab: Path = typer.Option(..., "--vocab", help="Vocab map from `vocab build`."),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory: metrics, checkpoints, final draft."),
    target: Optional[str] = typer.Option(None, "--target", "-t"),
    taps: Optional[str] = typer.Option(None, "--taps"),
    taps_from: str = typer.Option("boundary", "--taps-from"),
    max_length: int = typer.Option(DEFAULT_MAX_LENGTH, "--max-length"),
    limit: Optional[int] = typer.Option(None, "--limit"),
    heldout_fraction: float = typer.Option(DEFAULT_HELDOUT_FRACTION, "--heldout-fraction"),
    train_limit: Optional[int] = typer.Option(None, "--train-limit", help="Train on only the first N training "
                                              "samples of --features (held-out set unchanged): data-scaling experiments."),
    split_turns: bool = typer.Option(False, "--split-turns"),
    also_features: Optional[list[Path]] = typer.Option(None, "--also-features", help="Extra feature dirs (same "
                                                      "taps): every sample trains; held-out comes from --features."),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoints/latest."),
    max_steps: int = typer.Option(T.max_steps, "--max-steps"),
    batch_size: int = typer.Option(T.batch_size, "--batch-size", help="Samples per micro-batch per process."),
    grad_accum: int = typer.Option(T.grad_accum, "--grad-accum"),
    lr: float = typer.Option(T.lr, "--lr"),
    warmup_steps: int = typer.Option(T.warmup_steps, "--warmup-steps"),
    ttt_steps: int = typer.Option(T.ttt_steps, "--ttt-steps", help="Training-time-test unroll length."),
    ttt_decay: float = typer.Option(T.ttt_decay, "--ttt-decay", help="Loss weight decay**position."),
    loss: str = typer.Option(T.loss, "--loss", help="soft_ce or forward_kl."),
    supervise: str = typer.Option(T.supervise, "--supervise", help="answers, or all (prompt tokens too)."),
    num_layers: int = typer.Option(T.num_layers, "--num-layers", help="Draft decoder layers."),
    init_layers_from_target: bool = typer.Option(T.init_layers_from_target, "--init-layers-from-target",
                                                 help="Start the draft's layers from the target's top layers."),
    eval_every: int = typer.Option(T.eval_every, "--eval-every"),
    ckpt_every: int = typer.Option(T.ckpt_every, "--ckpt-every"),
    seed: int = typer.Option(T.seed, "--seed"),
    dtype: str = typer.Option(T.dtype, "--dtype", help="auto (bf16 autocast on GPUs and on CPUs with native bf16: "
                              "AVX512-BF16/AMX, detected), fp32, or bf16 (refused where bf16 is emulated)."),
    snapshot_steps: str = typer.Option("", "--snapshot-steps", help="Comma list of steps at which the draft is also "
                                       "kept (OUT/snapshots/step-N): a one-pass run's data-scaling curve."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="Warm start from this draft (same taps; "
                                             "head rows remapped by target id; optimizer and lr schedule fresh)."),
) -> None:
    """Train an EAGLE-3 draft with training-time test (runs under torchrun for DDP)."""
    cli = _cli()
    cfg = TrainConfig(max_steps=max_steps, batch_size=batch_size, grad_accum=grad_accum, lr=lr,
                      warmup_steps=warmup_steps, ttt_steps=ttt_steps, ttt_decay=ttt_decay, loss=loss, supervise=supervise,
                      num_layers=num_layers, init_layers_from_target=init_layers_from_target, eval_every=eval_every, ckpt_every=ckpt_every, seed=seed,
                      dtype=dtype, init_from=str(init_from) if init_from else "",
                      snapshot_steps=tuple(cli.parse_ints(snapshot_steps)) if snapshot_steps else ())
    cli.friendly(_train)(cli, cfg, data, features, vocab, out, target, taps, taps_from, max_length, limit,
                         heldout_fraction, split_turns, resume, train_limit, also_features or [])


def _train(cli, cfg, data, features, vocab, out, target, taps, taps_from, max_length, limit, heldout_fraction,
           split_turns, resume, train_limit=None, also_features=()) -> None:
    from eaglewire.data.features import FeatureMix, OfflineFeatures, OnlineFeatures
    from eaglewire.data.samples import is_held_out
    from eaglewire.errors import EaglewireError
    from eaglewire.train import dist
    from eaglewire.train.loop import train
    from eaglewire.train.plot import plot_metrics
    from eaglewire.vocab import load_vocab

    if (data is None) == (features is None):
        raise EaglewireError("give exactly one data source", expected="--data (online) or --features (offline)",
                             found=f"--data={data}, --features={features}")
    info = dist.setup()
    tgt = cli._load(target)
    tgt.model.to(info.device)
    vmap, _, _ = load_vocab(vocab)
    contract = tgt.contract(_taps(tgt, taps, taps_from), vocab_map=vmap)
    if features is not None:
        source = OfflineFeatures(features, contract, pad_id=_pad_id(tgt))
        samples = source.samples()
    else:
        samples = prepare_samples(tgt, data, max_length, limit, split_turns)
        source = OnlineFeatures(tgt, contract, pad_id=_pad_id(tgt))
    heldout = [s for s in samples if is_held_out(s.id, heldout_fraction)]
    train_samples = [s for s in samples if not is_held_out(s.id, heldout_fraction)][:train_limit]
    if also_features:
        if features is None:
            raise EaglewireError("--also-features needs --features", expected="a primary feature dir",
                                 found="--data (online mode)")
        source = FeatureMix(source, [OfflineFeatures(d, contract, pad_id=_pad_id(tgt)) for d in also_features])
        train_samples += [s for part in range(1, len(source.parts)) for s in source.samples(part)]
    cli.err_console.print(f"{len(train_samples)} training / {len(heldout)} held-out samples; taps "
                          f"{list(contract.taps)}; contract {contract.fingerprint()}; rank {info.rank}/{info.world_size}")

    def on_step(r: dict) -> None:
        if info.is_main and (r["split"] == "heldout" or r["step"] % 10 == 0):
            acc = " ".join(f"{a:.2f}" for a in r.get("acc", []))
            extra = f" {r['tok_per_s']:.0f} tok/s" if "tok_per_s" in r else ""
            cli.err_console.print(f"\\[{r['split']}] step {r['step']} loss {r.get('loss', float('nan')):.3f} acc {acc}{extra}")

    last = train(tgt, contract, vmap, source, train_samples, heldout, cfg, out, info, resume=resume, on_step=on_step)
    if info.is_main:
        plot_metrics(out / "metrics.jsonl", out / "training.png")
        summary = {"heldout": last, "train_samples": len(train_samples), "heldout_samples": len(heldout),
                   "train_tokens": int(sum(len(s.input_ids) for s in train_samples)), "config": cfg.to_dict(),
                   "contract": contract.to_dict()}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        acc = last.get("acc", [float("nan")])
        cli.out_console.print(f"draft -> {out / 'draft'}; held-out top-1 accuracy per position: "
                              + ", ".join(f"{a:.3f}" for a in acc) + f"; curves -> {out / 'training.png'}")
    dist.teardown(info)


def register(app: typer.Typer) -> None:
    from eaglewire.cli_data import data_app

    app.add_typer(vocab_app, name="vocab")
    data_app.command("capture")(capture_cmd)
    app.command("train")(train_cmd)
