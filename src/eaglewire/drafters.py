"""Each drafter family's decoding, one `Decoding` record per family: how its proposer is built beside a runtime,
which layout its exports are written in, the tree a round verifies. The "decoding" part of the family's record
(families.py), so a second family is one `register` call, not a branch in every caller.

Below the composition root (eaglewire.compose, which builds decoders and loads drafts by asking `family_of`), above
the acceleration layer: EAGLE-3's proposer drafts with fastcpu's copy of the draft where the runtime is fastcpu's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from eaglewire import fastcpu
from eaglewire.contract import WiringContract
from eaglewire.decoding.block import BlockProposer, block_shape
from eaglewire.decoding.propose import EagleProposer, Proposer
from eaglewire.decoding.runtime import Runtime
from eaglewire.decoding.tree import DEFAULT_TREE, TreeShape
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import ContractMismatch, EaglewireError
from eaglewire.export.block import block_layout
from eaglewire.export.convert import detect_engine
from eaglewire.export.engines import ENGINES, Engine, engine_for
from eaglewire.export.layouts import config_ids, draft_config_from
from eaglewire.families import FAMILIES, families_with, register_part

EAGLE3 = "eagle3"  # the family of every contract that names none (all contracts before block drafters)
DFLASH = "dflash"  # block drafters (draft/dflash.py): a whole block of drafts from one forward


@dataclass(frozen=True)
class Decoding:
    """One drafter family's decoding: how its proposer is built beside a runtime, and which layout its exports are.

    proposer(draft, contract, shape, max_len, runtime) -> Proposer
    layout(config, side contract or None) -> the layout (a format name) that wrote an export of the family:
        what `load_draft` reads it as when no format is named
    shape(contract, knobs' shape or None) -> the tree a round verifies (None: the family's default)"""

    name: str
    proposer: Callable[[Any, WiringContract, TreeShape, int, Runtime], Proposer]
    layout: Callable[[dict[str, Any], WiringContract | None], str]
    shape: Callable[[WiringContract, TreeShape | None], TreeShape] = lambda _contract, shape: shape or DEFAULT_TREE


def register(decoding: Decoding) -> None:
    """Make `decoding` the one that decodes and loads drafts whose contract names its family (families.py)."""
    register_part(decoding.name, "decoding", decoding)


def family_of(contract: WiringContract | dict[str, Any] | None) -> Decoding:
    """The decoding of the family a contract (or its JSON form) names; EAGLE-3 where it names none."""
    name = (contract.get("family") if isinstance(contract, dict) else getattr(contract, "family", None)) or EAGLE3
    if name not in FAMILIES or not FAMILIES[name].has("decoding"):
        raise ContractMismatch(
            f"no drafter family {name!r} is registered",
            expected=", ".join(sorted(f.name for f in families_with("decoding"))),
            found=str(name),
            fix="upgrade eaglewire, or load the draft with the tool that made it",
        )
    found: Decoding = FAMILIES[name].part("decoding")
    return found


def proposal_shape(contract: WiringContract, shape: TreeShape | None) -> TreeShape:
    """The tree a draft with `contract` verifies per round, from the command-line knobs' shape (None: none
    given, the family's default: EAGLE-3's DEFAULT_TREE, a block drafter's whole block)."""
    return family_of(contract).shape(contract, shape)


# --- EAGLE-3 -------------------------------------------------------------------------------------------------
def _eagle3_layout(config: dict[str, Any], side: WiringContract | None) -> str:
    """The engine layout whose config this is: its own keys say which style; layouts of one style (SGLang's,
    its older releases', SpecForge's: the same keys, other meanings of norm_output and the ids) are told apart
    by the side file, the one whose reading of the config is the contract (without one: the style's own)."""
    found = detect_engine(config)
    if side is None:
        return found
    style = engine_for(found).config_style
    for name in (found, *(n for n in ENGINES if n != found and ENGINES[n].config_style == style)):
        if _reads_as(engine_for(name), config, side):
            return name
    return found  # none agrees: its reader then says where the config and the contract disagree


def _reads_as(layout: Engine, config: dict[str, Any], side: WiringContract) -> bool:
    """Whether `layout`'s reading of `config` gives the contract's norm flags and layer ids."""
    try:
        ids = config_ids(layout, config)
        conv = layout.convention_for(side.target.architecture)
        norm = draft_config_from(layout, config, side.num_taps).norm
    except EaglewireError:
        return False
    return norm == side.norm and (ids is None or list(ids) == list(side.engine_ids(conv)))


def _eagle3_proposer(
    draft: Eagle3Draft, contract: WiringContract, shape: TreeShape, max_len: int, rt: Runtime
) -> Proposer:
    """EAGLE-3's proposer: the draft's accelerated copy where the runtime is accelerated (compiled layouts
    only where the runtime's are, measured layouts only where the runtime's are), else the draft's own modules."""
    drafter = None
    if fastcpu.available() is None:
        from eaglewire.fastcpu.draft import FastDraft
        from eaglewire.fastcpu.runtime import FastRuntime

        if isinstance(rt, FastRuntime):
            drafter = FastDraft(draft, "auto", rt.compiled, calibrate=rt.calibrated)
    return EagleProposer(draft, shape, max_len, drafter, contract=contract)


register(Decoding(EAGLE3, _eagle3_proposer, _eagle3_layout))


# --- DFlash (block drafters) ---------------------------------------------------------------------------------
def _dflash_layout(config: dict[str, Any], side: WiringContract | None) -> str:
    """z-lab's, SGLang's or speculators' layout, told apart by the config's own keys and the side file's ids."""
    return block_layout(config, side)


def _dflash_proposer(
    draft: DFlashDraft, contract: WiringContract, shape: TreeShape, max_len: int, rt: Runtime
) -> Proposer:
    """The whole block drafted from one forward of the draft's own modules (no accelerated copy yet), the
    target's embedding and head it reads beside them."""
    draft.move_attached(draft.fc.weight.device)
    return BlockProposer(draft, contract, shape, max_len)


register(Decoding(DFLASH, _dflash_proposer, _dflash_layout, shape=block_shape))
