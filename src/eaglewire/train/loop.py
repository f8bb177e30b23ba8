"""The training loop (nanoGPT-shaped): AdamW or Muon, warm-up + cosine, grad-clip, eval, resume, for the
objective of the contract's family (train/objectives.py: EAGLE-3's TTT loss, DFlash's block loss).

One process (CPU, fp32):
    eaglewire train --data regenerated.jsonl.gz --vocab vocab.safetensors --out runs/d1

Several processes on one machine (DDP; gloo on CPU, nccl on GPUs; bf16 autocast on GPU):
    torchrun --standalone --nproc-per-node 8 -m eaglewire.cli train --data ... --out runs/d1

Several nodes (run on every node; same --out on shared storage; rank 0 logs and saves):
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500 -m eaglewire.cli train --data ... --out runs/d1

Each rank takes its own `batch_size` slice of every global batch; the TTT loss is normalised by the
supervised-position count over all ranks, so the DDP update equals a single process on the global
batch (tested). Resume (`--resume`) restores weights, optimizer state and step; the data order is a pure
function of (seed, epoch) and an objective's random choices (DFlash's anchors) a pure function of (seed,
micro-batch index), so the loss curve continues bit-exactly (tested).

Large targets (e.g. a 7168-wide MoE target, 3x7168 taps): the draft is ~1-2 B parameters with a 32k
head; wrap the objective's module (`TTTModel`) in FSDP (`torch.distributed.fsdp.fully_shard` on each draft layer and the
head) instead of DDP, capture features offline with the serving engine (SGLang/vLLM hidden-state
export) so the target never sits in the trainer's memory, and read shards per rank.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from eaglewire.contract import WiringContract
from eaglewire.data.samples import Sample
from eaglewire.draft.vocab import VocabMap
from eaglewire.export.checkpoint import save_checkpoint
from eaglewire.outputs import output_lock
from eaglewire.train import state as trainer_state
from eaglewire.train.config import TrainConfig
from eaglewire.train.dist import DistInfo, all_reduce_sum, barrier
from eaglewire.train.eagle3 import build_draft, feature_space  # noqa: F401  (callers import them from here)
from eaglewire.train.objectives import objective_for
from eaglewire.train.optim import build_optimizer
from eaglewire.train.ttt import TTTStats
from eaglewire.target.protocol import TargetTensors


def lr_at(step: int, c: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine down to lr * min_lr_ratio at max_steps."""
    if step < c.warmup_steps:
        return c.lr * (step + 1) / c.warmup_steps
    progress = min(1.0, (step - c.warmup_steps) / max(1, c.max_steps - c.warmup_steps))
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def global_batches(samples: list[Sample], c: TrainConfig, info: DistInfo, epoch: int) -> list[list[Sample]]:
    """This rank's micro-batches for one epoch: a seeded permutation, length-sorted in windows of
    8 global batches (less padding), sliced per rank. A pure function of (seed, epoch)."""
    g = torch.Generator().manual_seed(c.seed * 1000 + epoch)
    order = [samples[i] for i in torch.randperm(len(samples), generator=g, device="cpu").tolist()]
    gb = c.batch_size * info.world_size
    window = gb * 8
    for w in range(0, len(order), window):
        order[w : w + window] = sorted(order[w : w + window], key=lambda s: len(s.input_ids))
    batches = [order[i : i + gb] for i in range(0, len(order) - gb + 1, gb)]
    perm = torch.randperm(len(batches), generator=g, device="cpu").tolist()  # host-side draws
    return [batches[i][info.rank * c.batch_size : (info.rank + 1) * c.batch_size] for i in perm]


class MicroBatches:
    """Endless, resumable stream of this rank's micro-batches across epochs."""

    def __init__(self, samples: list[Sample], c: TrainConfig, info: DistInfo) -> None:
        self.samples, self.c, self.info = samples, c, info
        self.per_epoch = len(global_batches(samples, c, info, 0))
        if self.per_epoch == 0:
            raise ValueError(
                f"{len(samples)} training samples cannot fill one global batch of {c.batch_size * info.world_size}"
            )
        self._epoch, self._cache = -1, []

    def get(self, index: int) -> list[Sample]:
        epoch = index // self.per_epoch
        if epoch != self._epoch:
            self._epoch, self._cache = epoch, global_batches(self.samples, self.c, self.info, epoch)
        return self._cache[index % self.per_epoch]


def _log_line(path: Path, record: dict, info: DistInfo) -> None:
    if info.is_main:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop lines logged after the checkpoint so the curve continues without duplicates."""
    if path.exists():
        keep = [l for l in path.read_text().splitlines() if l and json.loads(l)["step"] <= step]
        path.write_text("".join(l + "\n" for l in keep))


def _acc(stats_list: list[TTTStats], info: DistInfo) -> tuple[list[float], list[int]]:
    steps = len(stats_list[0].correct)
    # on the rank's device: NCCL reduces CUDA tensors only
    correct = torch.tensor(
        [sum(s.correct[k] for s in stats_list) for k in range(steps)], dtype=torch.float64, device=info.device
    )
    counts = torch.tensor(
        [sum(s.counts[k] for s in stats_list) for k in range(steps)], dtype=torch.float64, device=info.device
    )
    correct, counts = all_reduce_sum(correct, info), all_reduce_sum(counts, info)
    return [float(a / n) if n else float("nan") for a, n in zip(correct, counts)], [int(n) for n in counts]


@torch.no_grad()
def evaluate(model: Any, features: Any, heldout: list[Sample], c: TrainConfig, info: DistInfo) -> dict:
    """Held-out per-position top-1 accuracy and loss over the first eval_batches of this rank's share. Draws
    (an objective's random choices, DFlash's anchors) are fixed negative numbers: every evaluation scores the
    same positions."""
    mine = heldout[info.rank :: info.world_size]
    stats, losses = [], []
    for i in range(0, min(len(mine), c.eval_batches * c.batch_size), c.batch_size):
        with _autocast(info, c.dtype):
            loss, st = model(
                features.batch(mine[i : i + c.batch_size]).to(info.device),
                draw=-1 - (i // c.batch_size) * info.world_size - info.rank,
            )
        stats.append(st)
        losses.append(float(loss))
    if not stats:
        return {}
    acc, counts = _acc(stats, info)
    on = {"dtype": torch.float64, "device": info.device}  # NCCL reduces CUDA tensors only
    chain = all_reduce_sum(torch.tensor([sum(s.chain[k] for s in stats) for k in range(len(acc))], **on), info)
    anchors = float(all_reduce_sum(torch.tensor([float(sum(s.anchors for s in stats))], **on), info))
    chain_acc = [float(a / anchors) if anchors else float("nan") for a in chain]
    tokens, rounds = all_reduce_sum(
        torch.tensor([float(sum(s.round_tokens for s in stats)), float(sum(s.rounds for s in stats))], **on), info
    ).tolist()
    # tau_chain: the teacher-forced tau of a greedy chain as long as the TTT unroll, anchored at every
    # position (see TTTStats.chain); tau_rounds: the same chains walked round by round as a decoder does
    return {
        "loss": sum(losses) / len(losses),
        "acc": acc,
        "positions": counts,
        "chain": chain_acc,
        "tau_chain": 1 + sum(chain_acc),
        "tau_rounds": tokens / rounds if rounds else float("nan"),
        "anchors": int(anchors),
    }


def train(
    target: TargetTensors,
    contract: WiringContract,
    vmap: VocabMap | None,
    features: Any,
    train_samples: list[Sample],
    heldout: list[Sample],
    c: TrainConfig,
    out: Path,
    info: DistInfo = DistInfo(),
    *,
    resume: bool = False,
    on_step: Callable[[dict], None] | None = None,
    stop_at: int | None = None,
) -> dict:
    """Train a draft of the contract's family (train/objectives.py); returns the last held-out evaluation.
    `vmap`: the draft vocabulary (EAGLE-3; DFlash optionally), None for the full one. `stop_at` simulates a kill (tests).
    The main rank holds `out`'s write lock throughout: a second run into the same folder is refused, naming this one."""
    with output_lock(out) if info.is_main else nullcontext():
        return _train(
            target,
            contract,
            vmap,
            features,
            train_samples,
            heldout,
            c,
            out,
            info,
            resume=resume,
            on_step=on_step,
            stop_at=stop_at,
        )


def _train(
    target: TargetTensors,
    contract: WiringContract,
    vmap: VocabMap | None,
    features: Any,
    train_samples: list[Sample],
    heldout: list[Sample],
    c: TrainConfig,
    out: Path,
    info: DistInfo,
    *,
    resume: bool,
    on_step: Callable[[dict], None] | None,
    stop_at: int | None,
) -> dict:
    if c.supervise not in ("answers", "all"):
        raise ValueError(f"supervise must be 'answers' or 'all', not {c.supervise!r}")
    out = Path(out)
    metrics = out / "metrics.jsonl"
    torch.manual_seed(c.seed)
    if c.family != contract.family:  # the resumable config and the checkpoint must name the same family
        raise ValueError(f"the config trains family {c.family!r}, the contract is a {contract.family!r} draft's")
    draft, model, opt, names, params = _build(target, contract, vmap, features, c, info)
    step = _first_step(out, metrics, resume, draft, target, opt, names, c, info)
    ddp = _wrap_ddp(model, info)
    stream = MicroBatches(train_samples, c, info)
    last_eval: dict = {}
    t0, tokens = time.perf_counter(), 0
    while step < c.max_steps:
        if stop_at is not None and step >= stop_at:
            return last_eval
        record = _train_step(ddp, model, opt, params, stream, features, step, c, info)
        tokens += record.pop("_tokens")
        step += 1
        record.update(step=step, split="train", tok_per_s=tokens / (time.perf_counter() - t0))
        _record(record, metrics, on_step, info)
        if step % c.eval_every == 0 or step == c.max_steps:
            model.eval()
            last_eval = {"step": step, "split": "heldout", **evaluate(model, features, heldout, c, info)}
            model.train()
            _record(last_eval, metrics, on_step, info)
        if info.is_main:
            _save_step(out, step, draft, contract, opt, names, c)
        barrier(info)
    if info.is_main:
        save_checkpoint(draft, contract, out / "draft")
    return last_eval


def _build(
    target: TargetTensors,
    contract: WiringContract,
    vmap: VocabMap | None,
    features: Any,
    c: TrainConfig,
    info: DistInfo,
) -> tuple[Any, Any, Any, list[str], list]:
    """The family's draft (built on the host, seeded as on any device, then moved), the objective's module
    around it, and the optimizer over the draft's trainable parameters: (draft, model, opt, names, params)."""
    objective = objective_for(contract)
    with torch.device("cpu"):
        draft = objective.build_draft(target, contract, vmap, c)
    draft = draft.to(info.device)
    model = objective.build_model(draft, target, vmap, features, c, info)
    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    opt = build_optimizer(named, c.optimizer, c.lr, (c.beta1, c.beta2), c.weight_decay)
    return draft, model, opt, names, params


def _first_step(
    out: Path,
    metrics: Path,
    resume: bool,
    draft: Any,
    target: TargetTensors,
    opt: Any,
    names: list[str],
    c: TrainConfig,
    info: DistInfo,
) -> int:
    """The step training starts at: a resume's checkpointed one (weights and optimizer state restored, the
    metrics logged after it dropped), else 0 in a fresh `out` (a finished run's folder is refused)."""
    if not resume:
        trainer_state.refuse_to_overwrite(out, any_entry=False)
    latest = trainer_state.latest_state(out) if resume else None
    if latest is not None:
        step = trainer_state.load_state(latest, draft, target, opt, names, c.to_dict())
        if info.is_main:
            _truncate_metrics(metrics, step)
        return step
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        metrics.unlink(missing_ok=True)
    return 0


def _wrap_ddp(model: Any, info: DistInfo) -> Any:
    """The module a step runs: DDP around the objective's module when several processes train, else itself."""
    if not info.enabled:
        return model
    return DDP(model, device_ids=[info.local_rank]) if info.device.startswith("cuda") else DDP(model)


def _record(record: dict, metrics: Path, on_step: Callable[[dict], None] | None, info: DistInfo) -> None:
    """One line of the metrics log (main rank), and the caller's progress hook."""
    _log_line(metrics, record, info)
    if on_step:
        on_step(record)


def _save_step(
    out: Path, step: int, draft: Any, contract: WiringContract, opt: Any, names: list[str], c: TrainConfig
) -> None:
    """The main rank's saves after a step: the resumable state every ckpt_every steps (and at the end), a
    snapshot checkpoint at each of snapshot_steps."""
    if step % c.ckpt_every == 0 or step == c.max_steps:
        trainer_state.save_state(out, step, draft, contract, opt, names, c.to_dict())
    if step in c.snapshot_steps:
        save_checkpoint(draft, contract, out / "snapshots" / f"step-{step:06d}")


def _train_step(
    ddp: Any,
    model: Any,
    opt: Any,
    params: list,
    stream: MicroBatches,
    features: Any,
    step: int,
    c: TrainConfig,
    info: DistInfo,
) -> dict:
    lr = lr_at(step, c)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    stats, loss_sum, tokens = [], 0.0, 0
    for micro in range(c.grad_accum):
        fb = features.batch(stream.get(step * c.grad_accum + micro)).to(info.device)
        tokens += int(fb.attention_mask.sum())
        sync = micro == c.grad_accum - 1 or not info.enabled
        ctx = ddp.no_sync() if not sync else nullcontext()
        with ctx, _autocast(info, c.dtype):
            draw = (step * c.grad_accum + micro) * info.world_size + info.rank  # seeds the objective's choices
            loss, st = ddp(fb, all_positions=c.supervise == "all", draw=draw)
            (loss / c.grad_accum).backward()
        stats.append(st)
        loss_sum += float(loss.detach()) / c.grad_accum
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, c.grad_clip))
    opt.step()
    acc, counts = _acc(stats, info)
    losses = [sum(s.losses[k] for s in stats) / len(stats) for k in range(len(stats[0].losses))]
    # Each rank's loss is its share of the global-batch loss (times world size): average for the log.
    loss_sum = (
        float(all_reduce_sum(torch.tensor(loss_sum, dtype=torch.float64, device=info.device), info)) / info.world_size
    )
    return {
        "lr": lr,
        "loss": loss_sum,
        "loss_k": losses,
        "acc": acc,
        "positions": counts,
        "grad_norm": grad_norm,
        "_tokens": tokens * info.world_size,
    }


def _autocast(info: DistInfo, dtype: str = "auto"):
    """bf16 autocast (weights, optimizer and the loss' targets stay fp32) on GPUs and on CPUs whose bf16 is
    native (detected, never assumed: hw.native_bf16); plain fp32 elsewhere, where bf16 is emulated and slower."""
    from eaglewire.hw import autocast_dtype

    low = autocast_dtype(info.device, dtype)
    if low is None:
        return nullcontext()
    return torch.autocast("cuda" if info.device.startswith("cuda") else "cpu", dtype=low)
