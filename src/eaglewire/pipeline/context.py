"""What every stage of `eaglewire run` is handed (Ctx: the run config, the target, the finished stages' results
and directories, progress and log), and what several stages read through it: the run's training samples, the
warm start `init_from` resolves to, the draft vocabulary file the family trains with."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from eaglewire.contract import WiringContract
from eaglewire.pipeline.config import RunConfig
from eaglewire.target.loader import Target

Progress = Callable[[float, float | None, str], None]  # (completed, total, detail)


@dataclass
class Ctx:
    cfg: RunConfig
    out: Path
    target: Target
    contract: WiringContract  # taps chosen, no vocab map yet
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # finished stages' results
    dirs: dict[str, Path] = field(default_factory=dict)  # finished stages' work directories
    progress: Progress = lambda done, total, detail: None
    log: Callable[[str], None] = print
    command: str = ""  # the command line that ran (the report names it)

    @property
    def device(self) -> str:
        """Where the stages run: the run's target's device (the run config's `device` put it there)."""
        return str(self.target.device)


def regen_file(ctx: Ctx) -> Path:
    return ctx.dirs["regenerate"] / "regen.jsonl.gz"


def run_samples(ctx: Ctx) -> list:
    """Training samples: the regenerated versions of the FIRST `conversations` of the source. Selected by
    id, not by file position: a file grown by a larger earlier run (or shipped) is ordered by generation
    batches, and the data a config trains on must not depend on that history."""
    from eaglewire.data.conversations import read_conversations
    from eaglewire.data.samples import tokenize_conversations

    wanted = {c.id for _, c in zip(range(ctx.cfg.data.conversations), read_conversations(ctx.cfg.data.source))}
    convs = (c for c in read_conversations(regen_file(ctx)) if c.id in wanted)
    return tokenize_conversations(ctx.target.tokenizer, convs, max_length=ctx.cfg.data.max_length)


def resolve_init(ctx: Ctx, cfg: Any) -> Any:
    """init_from 'released': the released draft for this target when the
    package has one for it, the run's taps and its family; otherwise a fresh draft, said in the log."""
    from eaglewire.export.checkpoint import read_checkpoint_config, released_draft_dir

    if cfg.init_from != "released":
        return cfg
    path = released_draft_dir()
    _, contract, _ = read_checkpoint_config(path)
    if (
        contract.target.config_sha256 != ctx.target.identity.config_sha256
        or tuple(contract.taps) != ctx.contract.taps
        or contract.family != cfg.family
    ):
        ctx.log(f"no released {cfg.family} draft for this target and taps: training starts from a fresh draft")
        return replace(cfg, init_from="")
    return replace(cfg, init_from=str(path))


def draft_vocab_file(ctx: Ctx, cfg: Any) -> Path | None:
    """The vocab stage's map where the family drafts a reduced vocabulary (train/objectives.py), or where the
    run asks a DFlash draft for its own head over the run's vocabulary (family.reduced_vocab); else None."""
    from eaglewire.train.objectives import objective

    if objective(cfg.family).reduced_vocab or ctx.cfg.family.reduced_vocab:
        return Path(ctx.results["vocab"]["file"])
    return None
