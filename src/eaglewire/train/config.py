"""The training knobs, each defined once: its default, type, bounds and one-line description.

`TrainConfig` is what the training loop reads. The two places a user sets knobs are derived from its
fields, never declared again: `eaglewire train`'s options (cli/common.py `field_options`: `--max-steps`
for `max_steps`, the description as help) and the `train` section of the run config (pipeline/config.py
`TrainCfg`, from `knob_fields("run")`). Adding a knob is one `knob(...)` line here.

Each knob says where it is set: `cli` (an option of `eaglewire train`) and `run` (a key of the run
config's `train` section); a knob with neither keeps its default (the optimizer's constants). The
run config exposes fewer knobs than the CLI on purpose: its `train` section is the train stage's cache
key, so a knob added there re-trains every run directory made before it.

Choices (`choices=`) are enforced where values come from a user (the derived CLI and run-config schemas
turn them into a Literal), not by `TrainConfig` itself: the loop's own checks (ttt.LOSSES, warm.TRAIN_ONLY)
refuse a bad value passed in code with a message naming the valid ones.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

from eaglewire.norms import NORM_PRESETS, NormFlags
from eaglewire.train.optim import OPTIMIZERS
from eaglewire.train.ttt import LOSSES
from eaglewire.train.warm import TRAIN_ONLY

SUPERVISE = ("answers", "all")
FAMILY_NAMES = ("eagle3", "dflash")  # the families train/objectives.py holds an objective for (tested equal)
DTYPES = ("auto", "fp32", "bf16")  # hw.autocast_dtype's choices
# The norm set `norms: auto` gives a draft trained from scratch: SGLang and vLLM both serve it, and at equal data
# it trains better drafts than plain EAGLE-3 (`python -m benchmarks.peer_training.peer_training`,
# docs/results/peer-training.md).
NEW_DRAFT_NORMS = "eagle3.1"


def knob(
    default: Any,
    description: str,
    *,
    cli: bool = True,
    run: bool = True,
    choices: tuple[str, ...] = (),
    path: bool = False,
    **bounds: float,
) -> Any:
    """One training knob: a pydantic Field (`bounds`: ge/gt/le/lt) whose extra says where users set it,
    its valid values (`choices`) and whether it names a file (`path`: the CLI takes a path, '' = none)."""
    extra: dict[str, Any] = {"cli": cli, "run": run}
    if choices:
        extra["choices"] = list(choices)
    if path:
        extra["path"] = True
    return Field(default, description=description, json_schema_extra=extra, **bounds)  # type: ignore[arg-type]


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TrainConfig:
    """Every training knob of one draft (ew.train_draft's config; `eaglewire train`'s options and a run config's
    `train` section set the same fields), each validated on construction: TrainConfig(max_steps=300, lr=1e-3)."""

    # a pydantic dataclass, not a BaseModel: `dataclasses.replace` and `asdict` keep working for its callers
    max_steps: int = knob(300, "optimizer steps", ge=1)
    batch_size: int = knob(4, "samples per micro-batch per process", ge=1)
    grad_accum: int = knob(1, "micro-batches per optimizer step", run=False, ge=1)
    lr: float = knob(1e-3, "peak learning rate (small drafts on little data like a high one: experiment log)", gt=0)
    min_lr_ratio: float = knob(0.1, "the cosine schedule ends at lr * this", cli=False, run=False, ge=0, le=1)
    warmup_steps: int = knob(20, "linear warm-up steps to lr", ge=0)
    optimizer: str = knob(
        "adamw",
        "adamw, or muon: Muon on the draft's hidden matrices and AdamW on the head and norms",
        choices=OPTIMIZERS,
    )
    weight_decay: float = knob(
        0.0, "weight decay (AdamW's, and Muon's under optimizer muon)", cli=False, run=False, ge=0
    )
    beta1: float = knob(0.9, "AdamW beta1", cli=False, run=False, ge=0, lt=1)
    beta2: float = knob(0.95, "AdamW beta2", cli=False, run=False, ge=0, lt=1)
    grad_clip: float = knob(0.5, "gradient-norm clip", cli=False, run=False, gt=0)
    ttt_steps: int = knob(7, "training-time-test unroll length", ge=1)
    ttt_decay: float = knob(0.8, "loss weight decay**position", ge=0)
    loss: str = knob("soft_ce", "the step loss (experiment log: recipe levers)", choices=tuple(LOSSES))
    supervise: str = knob(
        "answers",
        "answers, or all: prompt tokens supervised too (more signal per step; experiment log: recipe levers)",
        choices=SUPERVISE,
    )
    round_weight: float = knob(
        0.0,
        "extra loss weight w on the chains anchored where greedy decoding with the "
        "current draft starts a round (weight 1 + w, the others 1): online tau is made "
        "of those",
        run=False,
        ge=0,
    )
    feature_weight: float = knob(
        0.0,
        "weight w of a feature loss: the mean squared centred logit over the whole "
        "target vocab between the draft's state (mapped into the target's) and the "
        "target's next state, tokens outside V_d too (train/ttt.py); 0: off",
        run=False,
        ge=0,
    )
    num_layers: int = knob(1, "draft decoder layers", ge=1)
    # The drafter family, and DFlash's block objective (train/block.py). CLI-only: the run config's train section
    # is the train stage's cache key, which a new key would change for every EAGLE-3 run made before it.
    family: str = knob(
        "eagle3",
        "the drafter family trained: eagle3 (chain/tree drafts, TTT "
        "loss) or dflash (a block drafter: one pass drafts block_size - 1 tokens)",
        run=False,
        choices=FAMILY_NAMES,
    )
    block_size: int = knob(
        8, "dflash: tokens per draft pass, the anchor included (speculators' default)", run=False, ge=2
    )
    anchors: int = knob(
        32, "dflash: random anchors (blocks) per sequence and step, all trained in one forward", run=False, ge=1
    )
    block_gamma: float = knob(
        4.0, "dflash: slot k's loss weight exp(-(k-1)/gamma) (speculators' and DeepSpec's default)", run=False, gt=0
    )
    norms: str = knob(
        "auto",
        "the draft's norm set (norms.NORM_PRESETS): eagle3 = none, every engine serves "
        "it; eagle3.1 = an RMSNorm on each captured state and the post-norm state fed back (SGLang, "
        f"vLLM); speculators = speculators' eagle3 defaults (vLLM); auto = {NEW_DRAFT_NORMS} for a "
        "new draft, the warm-start draft's own with init_from",
        choices=("auto", *NORM_PRESETS),
    )
    eval_every: int = knob(50, "steps between held-out evaluations", ge=1)
    eval_batches: int = knob(8, "held-out micro-batches per evaluation, per process", cli=False, run=False, ge=1)
    ckpt_every: int = knob(100, "steps between checkpoints (what --resume continues from)", ge=1)
    seed: int = knob(0, "the draft's init and the data order (a pure function of seed and epoch)")
    dtype: str = knob(
        "auto",
        "autocast: auto = bf16 on GPUs and on CPUs with native bf16 (AVX512-BF16/AMX, "
        "detected), else fp32; bf16 is refused where emulated",
        choices=DTYPES,
    )
    init_from: str = knob(
        "",
        "warm start from this draft (same taps; head rows remapped by target id; optimizer "
        "and lr schedule fresh); '' = a fresh draft ('released' in a run config: the draft "
        "shipped for the embedded target)",
        path=True,
    )
    init_layers_from_target: bool = knob(
        False,
        "start the draft's layers from the target's: EAGLE-3, layer i as "
        "target layer L - num_layers + i (layer 0's embedding half of q/k/v stays "
        "random); dflash, layer i as the target layer reading the last tap + i, "
        "fc passing that tap through",
        run=False,
    )
    train_only: str = knob(
        "",
        "what trains: every weight (''), the head alone (head), only the head rows a "
        "grown vocab adds to init_from (new_head_rows: its own weights stay exactly as they were), "
        "or everything but the head (body: a fresh draft's head stays the target's rows)",
        run=False,
        choices=TRAIN_ONLY,
    )
    snapshot_steps: tuple[int, ...] = knob(
        (),
        "also keep the draft at these steps (OUT/snapshots/step-N): one "
        "pass over fresh data makes them a data-scaling curve",
        run=False,
    )

    def to_dict(self) -> dict[str, Any]:
        # through JSON, so it compares equal to the copy a checkpoint stored (tuples come back as lists)
        return json.loads(json.dumps(dataclasses.asdict(self)))


def draft_norms(c: TrainConfig) -> NormFlags:
    """The norm flags the trained draft's contract carries: the named preset, or with `auto` the warm-start
    draft's own (a warm start never changes the function its weights compute) or NEW_DRAFT_NORMS."""
    if c.norms != "auto":
        return NORM_PRESETS[c.norms]
    if c.init_from:
        from pathlib import Path

        from eaglewire.export.checkpoint import read_checkpoint_config

        return read_checkpoint_config(Path(c.init_from))[1].norm
    return NORM_PRESETS[NEW_DRAFT_NORMS]


def knob_fields(where: Literal["cli", "run"]) -> dict[str, Any]:
    """The knobs set `where`, in definition order, as pydantic model fields {name: (annotation, FieldInfo)}:
    a knob with choices becomes a Literal of them, so a wrong value is refused with its valid ones named."""
    out: dict[str, Any] = {}
    for name, info in TrainConfig.__pydantic_fields__.items():
        extra = info.json_schema_extra
        assert isinstance(extra, dict), f"{name}: declare training knobs with knob()"
        if not extra[where]:
            continue
        field = copy.copy(info)
        field.json_schema_extra = {"format": "path"} if extra.get("path") else None  # the CLI takes a Path
        annotation = Literal[tuple(extra["choices"])] if "choices" in extra else info.annotation
        out[name] = (annotation, field)
    return out
