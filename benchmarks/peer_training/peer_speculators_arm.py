"""The speculators side of `peer_training.py`: runs INSIDE the speculators venv (scripts/speculators_venv.sh),
never imports eaglewire, and talks to the caller through files only (JSON in, safetensors/JSON out).

    $SPECULATORS_PY benchmarks/peer_training/peer_speculators_arm.py JOB.json

JOB.json (written by peer_training.py): features (an eaglewire capture dir: safetensors shards + manifest),
batches (per step, the sample ids of that step, in order: the very batches eaglewire's trainer takes), vocab
(safetensors with d2t/t2d), verifier (the target's HF directory), target_layer_ids, out, threads.

What of speculators' training code runs, and what does not (and why):
- its config schema (`TrainConfig.from_sources`) resolves every default it has for eagle3: optimiser (Muon on
  2-D weights + AdamW, lr 1e-3, weight decay 0.01/0.1), linear schedule with 1% warm-up, kl_div loss, TTT 3
  with decay 1.0, norm_before_fc / norm_output / norm_before_residual on, 1 llama layer, frozen embedding;
- its `build_draft_model` -> `Eagle3DraftModel.from_training_args` (lm_head from the verifier's rows, its own
  TTT forward and loss), `get_trainer_kwargs`, and its `Trainer.train_epoch` (its step: autocast, backward,
  clip 1.0, optimiser and scheduler steps);
- its `BaseDataset.__getitem__`, `CollateFn` (packing into one row) and `shift_batch` (the eagle3 alignment);
- changed, for a CPU: draft_attn_impl "sdpa" (flex attention needs a GPU compiler), loss_implementation
  "eager" (the fused losses import triton), hidden_states_dtype float32 (its autocast is keyed to the
  accelerator type, "cuda" when none: off on a CPU, and a bf16 row would then meet fp32 weights), the
  trainer's device (`get_local_rank` -> "cpu"; it would move the model to cuda:0) and its step timer's
  `torch.accelerator.synchronize` (a no-op: it raises without an accelerator);
- replaced: its data loading (arrow dataset + hidden-state files written by its vLLM pipeline) by a dataset
  over eaglewire's shards, and its multipack sampler by the caller's batch list (equal data, equal order).
  Each step's samples are packed into exactly their total length (no padding row), as its multipack sampler
  fills rows nearly full;
- its `verifier_norm` is an identity here: eaglewire's shards store the target's state AFTER its final norm
  (the state whose head gives the logits), speculators' files the one before it.

DFlash (job "family": "dflash"; speculators' `DFlashDraftModel`, speculators/models/dflash/): the same schema,
`build_draft_model` -> `DFlashDraftModel.from_training_args` (embedding and full-vocabulary head from the
verifier, no d2t), `get_trainer_kwargs`, its own forward (`select_anchors` over the packed row, the anchor/block
mask of `create_anchor_block_mask_mod`, targets from the verifier head one position back, `compute_metrics`:
its loss and per-position weights) and the same `Trainer.train_epoch`. Its own defaults run where they are a
recipe (loss `ce`, D-PACE position weights, optimiser, schedule); pinned to eaglewire's draft so that the
compute is equal: block size, mask token, taps and draft layers (the job's), every layer full attention
(`full_attention_indices`; its default makes every layer sliding-window, which eaglewire's DFlash does not
compute), `sliding_window_non_causal` true (it changes nothing here: its mask is non-causal in a full-attention
layer whatever the flag, attention.py; but its default, false, makes vLLM run every layer causal, and
eaglewire's import refuses it), and `max_anchors` = eaglewire's anchors per sequence x the step's samples (it draws anchors over the
packed row, eaglewire per sequence). Changed for a CPU: draft_attn_impl "sdpa" (its default
"simple_flex_attention" compiles flex attention's block mask, which needs a GPU compiler; "sdpa" takes the
dense boolean mask flex attention's `create_mask` builds from the same mask mod), loss_implementation "eager";
its forward's torch.compile is off by itself without CUDA (`conditional_torch_compile`). No preprocess (DFlash
reads unshifted rows) and no probe (its forward returns a loss, not per-slot tokens): the import is checked by
the scoring's tau instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.utils.data import DataLoader


def _rows(features: Path) -> dict[str, tuple[Path, int]]:
    """sample id -> (shard file, row index), from the shards' own metadata."""
    manifest = json.loads((features / "manifest.json").read_text())
    index = {}
    for sh in manifest["shards"]:
        path = features / sh["file"]
        with safe_open(str(path), framework="pt") as f:
            for j, sid in enumerate(json.loads(f.metadata()["sample_ids"])):
                index[sid] = (path, j)
    return index


def make_dataset(features: Path, ids: list[str]):
    """speculators' BaseDataset over eaglewire shards: raw rows as its file backend returns them (taps as
    `hidden_states`, the final state as `verifier_last_hidden_states`); its __getitem__ adds lengths and
    position ids."""
    from speculators.train.data import BaseDataset

    index, cache = _rows(features), {}

    class ShardDataset(BaseDataset):
        def _compute_approx_lengths(self) -> list[int]:
            return [0] * len(ids)

        def __len__(self) -> int:
            return len(ids)

        def _get_raw_data(self, i: int) -> dict:
            path, j = index[ids[i]]
            if path not in cache:
                with safe_open(str(path), framework="pt") as f:
                    cache[path] = {
                        k: f.get_tensor(k) for k in ("input_ids", "loss_mask", "taps", "final_hidden", "offsets")
                    }
            sh = cache[path]
            a, b = int(sh["offsets"][j]), int(sh["offsets"][j + 1])
            return {
                "hidden_states": sh["taps"][a:b].float(),
                "input_ids": sh["input_ids"][a:b].long(),
                "verifier_last_hidden_states": sh["final_hidden"][a:b].float(),
                "loss_mask": sh["loss_mask"][a:b].bool(),
            }

    return ShardDataset(max_len=1 << 30, hidden_states_dtype=torch.float32)


class ExactPack:
    """speculators' CollateFn with its row length set to this step's total (after the shift): packed, unpadded."""

    def __init__(self, hidden_size: int, num_taps: int, family: str = "eagle3") -> None:
        from speculators.models.eagle3 import shift_batch
        from speculators.train.data import CollateFn

        self.shift = 1 if family == "eagle3" else 0  # DFlash reads the rows as captured
        self.inner = CollateFn(
            1, hidden_size, num_taps, dtype=torch.float32, preprocess=shift_batch if self.shift else None
        )

    def __call__(self, batch: list[dict]) -> dict:
        self.inner.max_len = sum(int(b["input_ids"].shape[0]) - self.shift for b in batch)
        return self.inner(batch)


def build(job: dict, steps: int):
    """(model, trainer config) as speculators' own `main` builds them from its resolved defaults."""
    import argparse

    from speculators.model import SpeculatorModel
    from speculators.train.cli import build_draft_model
    from speculators.train.config.schema import TrainConfig
    from speculators.train.trainer import TrainerConfig

    family = job.get("family", "eagle3")
    cli = {
        "verifier_name_or_path": job["verifier"],
        "save_path": str(Path(job["out"]) / "ckpt"),
        "draft_attn_impl": "sdpa",
        "loss_implementation": "eager",
        "hidden_states_dtype": "float32",
        "max_steps": steps,
        "target_layer_ids": job["target_layer_ids"],
        **family_cli(job),
        **job.get("overrides", {}),
    }
    cfg = TrainConfig.from_sources(cli=cli, argv=["peer_speculators_arm.py"])
    args = argparse.Namespace(**cfg.flatten())
    torch.manual_seed(args.seed)
    if job.get("vocab"):
        vocab = load_file(job["vocab"])
        d2t, t2d, v_d = vocab["d2t"].long(), vocab["t2d"].bool(), int(vocab["d2t"].numel())
    else:  # full vocabulary (DFlash): no mapping, the draft vocab the verifier's (its "no draft vocab" case)
        from transformers import AutoConfig

        d2t = t2d = None
        v_d = int(AutoConfig.from_pretrained(job["verifier"]).vocab_size)
    model_class = SpeculatorModel.registry[family]
    model = build_draft_model(args, model_class, t2d, d2t, v_d)
    model.verifier_norm = torch.nn.Identity()  # eaglewire stores the post-norm state (module docstring)
    train_kw, val_kw = model_class.get_trainer_kwargs(**vars(args))
    tc = TrainerConfig(
        num_epochs=1,
        save_path=args.save_path,
        lr=args.lr,
        train_call_kwargs=train_kw,
        val_call_kwargs=val_kw,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        muon_lr=args.muon_lr,
        muon_momentum=args.muon_momentum,
        muon_weight_decay=args.muon_weight_decay,
        muon_ns_steps=args.muon_ns_steps,
        muon_adjust_lr_fn=args.muon_adjust_lr_fn,
        scheduler_type=args.scheduler_type,
        scheduler_warmup_steps=args.scheduler_warmup_steps,
        scheduler_warmup_ratio=args.scheduler_warmup_ratio,
        scheduler_total_steps=args.scheduler_total_steps,
        scheduler_num_cosine_cycles=args.scheduler_num_cosine_cycles,
        hidden_states_dtype=torch.float32,
        log_freq=10**9,
        max_steps=steps,
    )
    resolved = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))}
    return model, tc, resolved


def family_cli(job: dict) -> dict:
    """The family's own settings: TTT depth for eagle3; for DFlash the draft eaglewire trains (module docstring)."""
    if job.get("family", "eagle3") == "eagle3":
        return {"ttt_steps": job["ttt_steps"]}
    return {
        "speculator_type": "dflash",
        "block_size": job["block_size"],
        "mask_token_id": job["mask_token_id"],
        "num_layers": job["num_layers"],
        "full_attention_indices": list(range(job["num_layers"])),
        "max_anchors": job["max_anchors"],
        "sliding_window_non_causal": True,
    }


@torch.no_grad()
def probe(job: dict, out: Path) -> None:
    """The trained draft's own TTT forward (teacher-forced, its mask) on the first step's first sample:
    each step's argmax over the draft vocab, for the caller to compare with the same draft imported into
    eaglewire (`peer_scoring.import_check`). Written to OUT/probe.safetensors with the inputs it used."""
    from safetensors.torch import save_file

    model, _, _ = build(job, 1)
    state = load_file(str(out / "draft" / "model.safetensors"))
    # the saved draft holds no verifier parts or embedding (the model keeps its own); every other key must match
    kept = {
        k: v for k, v in model.state_dict().items() if k.startswith(("verifier_", "embed_tokens")) and k not in state
    }
    try:
        model.load_state_dict({**kept, **state})
    except RuntimeError as err:
        raise SystemExit(f"probe: checkpoint keys differ from the model's: {err}") from None
    data = make_dataset(Path(job["features"]), job["batches"][0][:1])
    row = ExactPack(model.hidden_size, len(job["target_layer_ids"]))([data[0]])
    model.eval()
    tokens = model(
        hidden_states=row["hidden_states"],
        input_ids=row["input_ids"],
        document_ids=row["document_ids"],
        position_ids=row["position_ids"],
        ttt_steps=job["ttt_steps"],
    )
    save_file(
        {
            "input_ids": row["input_ids"][0].contiguous(),
            "hidden_states": row["hidden_states"][0].contiguous(),
            "tokens": torch.stack([t[0] for t in tokens]).contiguous(),
        },
        str(out / "probe.safetensors"),
    )


def main() -> None:
    if sys.argv[1] == "--probe":
        job = json.loads(Path(sys.argv[2]).read_text())
        torch.set_num_threads(int(job["threads"]))
        return probe(job, Path(job["out"]))
    job = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(int(job["threads"]))
    import speculators.train.trainer as trainer_mod

    trainer_mod.get_local_rank = lambda: "cpu"  # its Trainer would .to(0), i.e. cuda:0
    torch.accelerator.synchronize = lambda *_a, **_k: None  # its step timer's; a CPU has nothing to wait for
    batches, out = job["batches"], Path(job["out"])
    ids = [sid for b in batches for sid in b]
    data = make_dataset(Path(job["features"]), ids)
    spans, k = [], 0
    for b in batches:  # batch i = dataset rows k..k+len(b)
        spans.append(list(range(k, k + len(b))))
        k += len(b)
    model, tc, resolved = build(job, len(batches))
    pack = ExactPack(model.hidden_size, len(job["target_layer_ids"]), job.get("family", "eagle3"))
    loader = DataLoader(data, batch_sampler=spans, collate_fn=pack, num_workers=0)
    trainer = trainer_mod.Trainer(model, tc, loader, None)
    t0 = time.perf_counter()
    trainer.train_epoch(0)
    wall = time.perf_counter() - t0
    tokens = sum(int(data._get_raw_data(i)["input_ids"].shape[0]) for i in range(len(ids)))
    model.save_pretrained(str(out / "draft"))
    (out / "train.json").write_text(
        json.dumps(
            {
                "steps": trainer.global_step,
                "tokens": tokens,
                "train_wall_s": wall,
                "tok_per_s": tokens / wall,
                "threads": torch.get_num_threads(),
                "resolved_defaults": resolved,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
