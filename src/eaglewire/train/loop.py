"""The training loop (nanoGPT-shaped): TTT loss, AdamW, warm-up + cosine, grad-clip, eval, resume.

One process (CPU, fp32):
    eaglewire train --data regenerated.jsonl.gz --vocab vocab.safetensors --out runs/d1

Several processes on one machine (DDP; gloo on CPU, nccl on GPUs; bf16 autocast on GPU):
    torchrun --standalone --nproc-per-node 8 -m eaglewire.cli train --data ... --out runs/d1

Several nodes (run on every node; same --out on shared storage; rank 0 logs and saves):
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500 -m eaglewire.cli train --data ... --out runs/d1

Each rank takes its own `batch_size` slice of every global batch; the TTT loss is normalised by the
supervised-position count over all ranks, so the DDP update equals a single process on the global
batch (tested). Resume (`--resume`) restores weights, AdamW state and step; the data order is a pure
function of (seed, epoch), so the loss curve continues bit-exactly (tested).

Large targets (e.g. a 7168-wide MoE target, 3x7168 taps): the draft is ~1-2 B parameters with a 32k
head; wrap `TTTModel` in FSDP (`torch.distributed.fsdp.fully_shard` on each draft layer and the
head) instead of DDP, capture features offline with the serving engine (SGLang/vLLM hidden-state
export) so the target never sits in the trainer's memory, and read shards per rank.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from eaglewire.contract import WiringContract
from eaglewire.data.samples import Sample
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.model import Eagle3Draft
from eaglewire.checkpoint import save_checkpoint
from eaglewire.errors import CheckpointError
from eaglewire.train import state as trainer_state
from eaglewire.train.dist import DistInfo, all_reduce_sum, barrier
from eaglewire.train.ttt import TTTModel, TTTStats
from eaglewire.vocab import VocabMap


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 300
    batch_size: int = 4  # samples per micro-batch per rank
    grad_accum: int = 1
    lr: float = 1e-3  # small drafts on little data like a high peak lr (measured, see README)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.5
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    loss: str = "soft_ce"  # any of ttt.LOSSES (measured: benchmarks/results/recipe)
    supervise: str = "answers"  # or "all": prompt tokens too (measured: benchmarks/results/recipe)
    round_weight: float = 0.0  # extra loss weight on chains where a decoder's round starts (ttt.round_starts)
    num_layers: int = 1
    eval_every: int = 50
    eval_batches: int = 8
    ckpt_every: int = 100
    seed: int = 0
    dtype: str = "auto"  # autocast: auto = bf16 on GPUs and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32
    init_from: str = ""  # warm start from this native draft (same taps): training that adds up across sittings
    init_layers_from_target: bool = False  # draft layer i starts as target layer L - num_layers + i (measured:
    # benchmarks/results/recipe); layer 0's embedding half of q/k/v stays random, since the target has none
    snapshot_steps: tuple[int, ...] = ()  # also keep the draft at these steps (OUT/snapshots/step-N): one pass
    # over fresh data makes them a data-scaling curve for the price of one run

    def to_dict(self) -> dict[str, Any]:
        # through JSON, so it compares equal to the copy a checkpoint stored (tuples come back as lists)
        return json.loads(json.dumps(dataclasses.asdict(self)))


def lr_at(step: int, c: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine down to lr * min_lr_ratio at max_steps."""
    if step < c.warmup_steps:
        return c.lr * (step + 1) / c.warmup_steps
    progress = min(1.0, (step - c.warmup_steps) / max(1, c.max_steps - c.warmup_steps))
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_draft(target: Any, contract: WiringContract, vmap: VocabMap, c: TrainConfig) -> Eagle3Draft:
    """Random draft; lm_head rows and final norm start from the target's (for the kept ids): the
    draft then begins by predicting what the target's head would from a similar state, which matters
    when CPU data is scarce. With `init_from`, the weights then come from that draft (warm start)."""
    draft = Eagle3Draft(DraftConfig.from_target(target.text_config, contract, num_layers=c.num_layers)).init_random(c.seed)
    with torch.no_grad():
        draft.d2t.copy_(vmap.d2t)
        draft.t2d.copy_(vmap.t2d)
        draft.lm_head.weight.copy_(target.head_rows(vmap.target_ids))  # [V_d, H]
        norm_w = target.final_norm_weight()
        if norm_w is not None and norm_w.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(norm_w)
    draft.attach_embedding(target.embedding())
    if c.init_layers_from_target:
        init_layers_from_target(draft, target)
    if c.init_from:
        warm_start(draft, Path(c.init_from), target, vmap, tuple(contract.taps))
    return draft


def init_layers_from_target(draft: Eagle3Draft, target: Any) -> None:
    """Start draft layer i from target decoder layer L - n + i (the top of the stack, whose input is closest
    to the fused state the draft reads). Layer 0's q/k/v read [embed ; hidden] (2H wide): the hidden half
    takes the target's projection, the embedding half keeps its random init. Refused where shapes differ."""
    n, L = draft.cfg.num_layers, target.num_layers
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            src = target.layer_parameters(L - n + i)
            for name, p in layer.named_parameters():
                if name not in src:
                    continue  # hidden_norm: the draft's own (the target has one input norm per layer)
                w = src[name]
                if layer.first and name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):
                    p[:, draft.cfg.hidden_size:].copy_(w)  # [out, 2H]: columns H: read hidden_norm(hidden)
                elif p.shape == w.shape:
                    p.copy_(w)
                else:
                    raise CheckpointError(f"cannot start draft layer {i} from target layer {L - n + i}",
                                          expected=f"{name} of shape {tuple(p.shape)}", found=str(tuple(w.shape)),
                                          fix="drop init_layers_from_target for this target")


GROWN_OUT_SCALE = 0.01  # an added layer's output projections start at this fraction of their random init


def mapped_head_rows(target_rows: torch.Tensor, kept: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Head rows for the ids a grown vocabulary adds: the target's own head rows carried into the trained
    draft's head space by the affine map that best carries them there on the ids both keep.

    target_rows [V_d, H] the target's head rows for every id of the new vocab; kept [V_d] bool the ids the
    source draft had; trained [n_kept, H] its trained rows for them, in the same order. Returns [V_d - n_kept,
    H] for the others. Why: a trained draft head is close to a linear image of the target's (the draft learns
    to reproduce the target's logits from a state that is close to a linear image of the target's final state;
    the released draft's 8,000 rows: R^2 0.93, 0.92 on rows left out of the fit), so a new token's row starts
    where training would move it, and the grown draft can name the token where the target would. Least squares
    (min-norm when fewer rows than H + 1 are kept)."""
    x = torch.cat([target_rows.float(), target_rows.new_ones(len(target_rows), 1, dtype=torch.float32)], 1)  # [V_d, H+1]
    affine = torch.linalg.lstsq(x[kept], trained.float(), driver="gelsd").solution  # [H+1, H]
    return x[~kept] @ affine


def warm_start(draft: Eagle3Draft, path: Path, target: Any, vmap: VocabMap, taps: tuple[int, ...]) -> dict[str, int]:
    """Copy a trained draft's weights into `draft` (a sitting continues the last one's training).

    Everything but the head is copied as is; the taps and layer shapes must match (refused otherwise:
    a draft trained on other boundaries is no warm start). The head is remapped by target id: rows of
    ids both vocabularies keep are copied; a row of an id new to this vocab starts as the target's head row
    for that id mapped into the draft's head space (`mapped_head_rows`). The target's rows as they are
    (what a fresh draft starts from) outscore the trained ones: the release grown to 16k rows that way scored
    tau 1.01 on the bench's MT-bench text, with rows of zeros 1.41, with the source's mean row + 0.1 x the
    target's row 1.989 (= the release: a new token never wins), mapped 1.997 (32k: 2.002), untrained
    (sittings 9-10; sitting 8's 16k lever had started from the target's rows).
    A deeper `draft` grows: the source's layers are copied and each added layer's two output projections
    (o_proj, down_proj) start at GROWN_OUT_SCALE of their random init, so the grown draft predicts what
    the source did (to ~1e-3) and every weight of the new layer learns from step 1. Not exactly zero: Adam normalises the gradient, so a layer whose output projections are zero
    gives its q/k/v and MLP inputs a zero update until those projections move (measured in sitting 8: 160
    steps of such a layer matched the 1-layer control to three decimals).
    The optimizer state and the lr schedule start afresh."""
    from eaglewire.checkpoint import load_checkpoint

    src = load_checkpoint(path, target=target)
    if tuple(src.contract.taps) != taps:
        raise CheckpointError(f"cannot warm-start from {path}: it reads other target boundaries",
                              expected=f"taps {list(taps)}", found=f"taps {list(src.contract.taps)}",
                              fix="train with the warm-start draft's taps, or drop init_from")
    mine, theirs = draft.state_dict(), src.state_dict()
    added = range(src.cfg.num_layers, draft.cfg.num_layers)  # empty unless the draft grows
    skip = {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"} | {k for k in mine if _layer_of(k) in added}
    bad = sorted(k for k in mine if k not in skip and (k not in theirs or theirs[k].shape != mine[k].shape))
    if bad or src.cfg.num_layers > draft.cfg.num_layers or src.cfg.num_taps != draft.cfg.num_taps:
        raise CheckpointError(f"cannot warm-start from {path}", expected=f"a draft of the same shape "
                              f"({draft.cfg.num_layers} layer(s), {draft.cfg.num_taps} taps)",
                              found=f"{src.cfg.num_layers} layer(s), {src.cfg.num_taps} taps; differing: {bad[:5]}",
                              fix="drop init_from, or train with the warm-start draft's shape")
    with torch.no_grad():
        for k in mine:
            if k not in skip:
                mine[k].copy_(theirs[k].to(mine[k].dtype))
        for i in added:  # near-zero output projections: the added layer starts near the identity
            draft.layers[i].self_attn.o_proj.weight.mul_(GROWN_OUT_SCALE)
            draft.layers[i].mlp.down_proj.weight.mul_(GROWN_OUT_SCALE)
        old_rows = {int(t): i for i, t in enumerate(src.to_target_ids(torch.arange(src.cfg.draft_vocab_size)))}
        kept = [(i, old_rows[int(t)]) for i, t in enumerate(vmap.target_ids) if int(t) in old_rows]
        head = draft.lm_head.weight  # [V_d, H]: the target's rows (build_draft) until copied over
        if kept:
            new_idx, old_idx = map(torch.tensor, zip(*kept))
            fresh = torch.ones(len(head), dtype=torch.bool)  # ids new to this vocab
            fresh[new_idx] = False
            if fresh.any():
                head[fresh] = mapped_head_rows(head, ~fresh, theirs["lm_head.weight"][old_idx]).to(head.dtype)
            head[new_idx] = theirs["lm_head.weight"][old_idx].to(head.dtype)
    return {"head_rows_copied": len(kept), "head_rows_from_target": draft.cfg.draft_vocab_size - len(kept),
            "layers_added": len(added)}


def _layer_of(key: str) -> int | None:
    """The decoder layer a state-dict key belongs to ('layers.3.mlp...' -> 3), None for the rest."""
    parts = key.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else None


def global_batches(samples: list[Sample], c: TrainConfig, info: DistInfo, epoch: int) -> list[list[Sample]]:
    """This rank's micro-batches for one epoch: a seeded permutation, length-sorted in windows of
    8 global batches (less padding), sliced per rank. A pure function of (seed, epoch)."""
    g = torch.Generator().manual_seed(c.seed * 1000 + epoch)
    order = [samples[i] for i in torch.randperm(len(samples), generator=g).tolist()]
    gb = c.batch_size * info.world_size
    window = gb * 8
    for w in range(0, len(order), window):
        order[w:w + window] = sorted(order[w:w + window], key=lambda s: len(s.input_ids))
    batches = [order[i:i + gb] for i in range(0, len(order) - gb + 1, gb)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i][info.rank * c.batch_size:(info.rank + 1) * c.batch_size] for i in perm]


class MicroBatches:
    """Endless, resumable stream of this rank's micro-batches across epochs."""

    def __init__(self, samples: list[Sample], c: TrainConfig, info: DistInfo) -> None:
        self.samples, self.c, self.info = samples, c, info
        self.per_epoch = len(global_batches(samples, c, info, 0))
        if self.per_epoch == 0:
            raise ValueError(f"{len(samples)} training samples cannot fill one global batch of "
                             f"{c.batch_size * info.world_size}")
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
    correct = torch.tensor([sum(s.correct[k] for s in stats_list) for k in range(steps)], dtype=torch.float64)
    counts = torch.tensor([sum(s.counts[k] for s in stats_list) for k in range(steps)], dtype=torch.float64)
    correct, counts = all_reduce_sum(correct, info), all_reduce_sum(counts, info)
    return [float(a / n) if n else float("nan") for a, n in zip(correct, counts)], [int(n) for n in counts]


@torch.no_grad()
def evaluate(model: TTTModel, features: Any, heldout: list[Sample], c: TrainConfig, info: DistInfo) -> dict:
    """Held-out per-position top-1 accuracy and loss over the first eval_batches of this rank's share."""
    mine = heldout[info.rank::info.world_size]
    stats, losses = [], []
    for i in range(0, min(len(mine), c.eval_batches * c.batch_size), c.batch_size):
        with _autocast(info, c.dtype):
            loss, st = model(features.batch(mine[i:i + c.batch_size]).to(info.device))
        stats.append(st)
        losses.append(float(loss))
    if not stats:
        return {}
    acc, counts = _acc(stats, info)
    chain = all_reduce_sum(torch.tensor([sum(s.chain[k] for s in stats) for k in range(len(acc))],
                                        dtype=torch.float64), info)
    anchors = float(all_reduce_sum(torch.tensor([float(sum(s.anchors for s in stats))], dtype=torch.float64), info))
    chain_acc = [float(a / anchors) if anchors else float("nan") for a in chain]
    tokens, rounds = all_reduce_sum(torch.tensor([float(sum(s.round_tokens for s in stats)),
                                                  float(sum(s.rounds for s in stats))], dtype=torch.float64), info).tolist()
    # tau_chain: the teacher-forced tau of a greedy chain as long as the TTT unroll, anchored at every
    # position (see TTTStats.chain); tau_rounds: the same chains walked round by round as a decoder does
    return {"loss": sum(losses) / len(losses), "acc": acc, "positions": counts, "chain": chain_acc,
            "tau_chain": 1 + sum(chain_acc), "tau_rounds": tokens / rounds if rounds else float("nan"),
            "anchors": int(anchors)}


def train(target: Any, contract: WiringContract, vmap: VocabMap, features: Any, train_samples: list[Sample],
          heldout: list[Sample], c: TrainConfig, out: Path, info: DistInfo = DistInfo(), *, resume: bool = False,
          on_step: Callable[[dict], None] | None = None, stop_at: int | None = None) -> dict:
    """Train a draft; returns the last held-out evaluation. `stop_at` simulates a kill (tests)."""
    if c.supervise not in ("answers", "all"):
        raise ValueError(f"supervise must be 'answers' or 'all', not {c.supervise!r}")
    out = Path(out)
    metrics = out / "metrics.jsonl"
    torch.manual_seed(c.seed)
    draft = build_draft(target, contract, vmap, c).to(info.device)
    model = _ttt_model(draft, target, vmap, features, c, info)
    names = [n for n, p in draft.named_parameters() if p.requires_grad]
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay, eps=1e-8)
    step = 0
    latest = trainer_state.latest_state(out) if resume else None
    if latest is not None:
        step = trainer_state.load_state(latest, draft, target, opt, names, c.to_dict())
        if info.is_main:
            _truncate_metrics(metrics, step)
    elif info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        metrics.unlink(missing_ok=True)
    ddp = (DDP(model, device_ids=[info.local_rank]) if info.device.startswith("cuda") else DDP(model)) \
        if info.enabled else model
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
        _log_line(metrics, record, info)
        if on_step:
            on_step(record)
        if step % c.eval_every == 0 or step == c.max_steps:
            model.eval()
            last_eval = {"step": step, "split": "heldout", **evaluate(model, features, heldout, c, info)}
            model.train()
            _log_line(metrics, last_eval, info)
            if on_step:
                on_step(last_eval)
        if info.is_main and (step % c.ckpt_every == 0 or step == c.max_steps):
            trainer_state.save_state(out, step, draft, contract, opt, names, c.to_dict())
        if info.is_main and step in c.snapshot_steps:
            save_checkpoint(draft, contract, out / "snapshots" / f"step-{step:06d}")
        barrier(info)
    if info.is_main:
        save_checkpoint(draft, contract, out / "draft")
    return last_eval


def _ttt_model(draft: Eagle3Draft, target: Any, vmap: VocabMap, features: Any, c: TrainConfig,
               info: DistInfo) -> TTTModel:
    """The draft and its TTT loss. Shards that store the target's top-1 need only the draft vocab's head rows
    ([V_d, H]); the full [V, H] head (its argmax) only for shards captured before top-1 was stored, and online."""
    full = not getattr(features, "stores_target_top1", False)
    head = target.head_rows(None if full else vmap.target_ids).detach().to(info.device)
    return TTTModel(draft, head if full else None, draft_head=None if full else head, steps=c.ttt_steps,
                    decay=c.ttt_decay, loss=c.loss, world_size=info.world_size,
                    reduce_count=lambda x: all_reduce_sum(x, info), round_weight=c.round_weight)


def _train_step(ddp: Any, model: TTTModel, opt: torch.optim.Optimizer, params: list, stream: MicroBatches,
                features: Any, step: int, c: TrainConfig, info: DistInfo) -> dict:
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
            loss, st = ddp(fb, all_positions=c.supervise == "all")
            (loss / c.grad_accum).backward()
        stats.append(st)
        loss_sum += float(loss.detach()) / c.grad_accum
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, c.grad_clip))
    opt.step()
    acc, counts = _acc(stats, info)
    losses = [sum(s.losses[k] for s in stats) / len(stats) for k in range(c.ttt_steps)]
    # Each rank's loss is its share of the global-batch loss (times world size): average for the log.
    loss_sum = float(all_reduce_sum(torch.tensor(loss_sum, dtype=torch.float64), info)) / info.world_size
    return {"lr": lr, "loss": loss_sum, "loss_k": losses, "acc": acc, "positions": counts,
            "grad_norm": grad_norm, "_tokens": tokens * info.world_size}


def _autocast(info: DistInfo, dtype: str = "auto"):
    """bf16 autocast (weights, optimizer and the loss' targets stay fp32) on GPUs and on CPUs whose bf16 is
    native (detected, never assumed: hw.native_bf16); plain fp32 elsewhere, where bf16 is emulated and slower."""
    from eaglewire.hw import autocast_dtype

    low = autocast_dtype(info.device, dtype)
    if low is None:
        return nullcontext()
    return torch.autocast("cuda" if info.device.startswith("cuda") else "cpu", dtype=low)
