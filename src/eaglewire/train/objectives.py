"""The training objective of each drafter family, keyed by the family name its contract carries.

The loop (train/loop.py) is family-blind: it asks the record for a draft, for the module whose forward is
`(FeatureBatch, all_positions, draw) -> (loss, TTTStats)` (one module, so DDP sees a single forward), and
the family's contract and default taps. Every family is saved and resumed in the native checkpoint
(export/checkpoint.py, keyed by the contract's family). A new family registers its Objective as its record's part, never a branch in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from eaglewire.contract import WiringContract, default_taps
from eaglewire.draft.vocab import VocabMap
from eaglewire.errors import ContractMismatch
from eaglewire.families import families_with, get_family, register_part
from eaglewire.train import dflash, eagle3
from eaglewire.train.config import TrainConfig


@dataclass(frozen=True)
class Objective:
    family: str
    default_taps: Callable[[int], tuple[int, ...]]  # (target layers L) -> the family's default boundaries
    # (target, taps, vocab map or None, config) -> the contract a new draft of this family is trained under
    make_contract: Callable[[Any, tuple[int, ...], VocabMap | None, TrainConfig], WiringContract]
    # Each family's own draft class and loss module flow through these (their signatures, in order):
    # (target, contract, vocab map or None, config) -> the draft, on the CPU, its frozen parts attached
    build_draft: Callable[..., nn.Module]
    # (draft, target, vocab map or None, features, config, dist) -> the draft with its loss, forward
    # (FeatureBatch, all_positions, draw) -> (loss, TTTStats)
    build_model: Callable[..., nn.Module]
    # True: the family's drafts need a reduced vocabulary (a vocab map, d2t) and the pipeline builds one; False:
    # the target's full vocabulary unless a map is given (DFlash)
    reduced_vocab: bool = True
    # `eaglewire run`'s defaults for the family, a partial run config applied over the budget (a config file and
    # flags still win): the best recipe measured for it (docs/results/experiments.md)
    run_defaults: dict[str, Any] = field(default_factory=dict)
    # run-config fields (section.key) the family's training and bench never read: `run --show-config` omits them
    unused_run_fields: tuple[str, ...] = ()


# DFlash's best measured recipe on a CPU (benchmarks/results/dflash/*-data-vocab, *-levers: block 4, 64 anchors,
# lr 3e-3, layers from the target, its own 16k head); its bench rows are the block's, not EAGLE-3's chain/tree.
# A draft with its own head is read by vLLM's DFlash loader only (export/block.py refuses the others): vllm alone.
DFLASH_RUN = {
    "family": {"block_size": 4, "anchors": 64, "init_from_target": True, "reduced_vocab": True},
    "train": {"lr": 3e-3, "init_from": ""},
    "vocab": {"draft_vocab_size": 16000},
    "bench": {"methods": ("vanilla", "dflash")},
    "formats": ("vllm",),
}
# Each family's training record is its record's "objective" part (families.py)
register_part(
    "eagle3", "objective", Objective("eagle3", default_taps, eagle3.make_contract, eagle3.build_draft, eagle3.ttt_model)
)
register_part(
    "dflash",
    "objective",
    Objective(
        "dflash",
        dflash.default_taps,
        dflash.make_contract,
        dflash.build_draft,
        dflash.block_model,
        reduced_vocab=False,
        run_defaults=DFLASH_RUN,
        unused_run_fields=(
            "train.ttt_steps",
            "train.ttt_decay",
            "bench.num_steps",
            "bench.topk",
            "bench.num_draft_tokens",
        ),
    ),
)


def objective(family: str) -> Objective:
    """The training record of `family`; a family with no training here is a clear error."""
    fam = get_family(family)
    if not fam.has("objective"):
        raise ContractMismatch(
            f"eaglewire cannot train a {family!r} draft",
            expected=" / ".join(f.name for f in families_with("objective")),
            found=repr(family),
            fix="train one of the families eaglewire has an objective for",
        )
    found: Objective = fam.part("objective")
    return found


def objective_for(contract: WiringContract) -> Objective:
    """The training record of the contract's family."""
    return objective(contract.family)
