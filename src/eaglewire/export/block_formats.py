"""Block drafters' export formats as records: where each format writes the taps is an engine record's row.

A block family's formats are its family record's "block_formats" part (families.py); each format names the
engine row (export/engines.py `block_fields`) whose field and convention it writes, so the numbering is the
engine's, written once. The writers are export/block.py's, the readers export/block_import.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglewire.errors import CheckpointError
from eaglewire.export.engines import engine_field
from eaglewire.families import FAMILIES, EngineField, families_with, get_family, register_part


@dataclass(frozen=True)
class BlockFormat:
    name: str
    style: str  # "hf" (z-lab's DFlashDraftModel config) or "speculators" (DFlashSpeculator)
    reads: tuple[str, str]  # (engine record, the name of its row): whose tap field holds the ids (export/engines.py)
    block_in_dflash_config: bool  # also write block_size / num_target_layers inside dflash_config
    source: str  # the engine code the record was read from
    family: str = "dflash"

    @property
    def tap(self) -> EngineField:
        """The engine record's field this format writes the taps to: where, and in which convention."""
        return engine_field(*self.reads, self.family)

    @property
    def ids_at(self) -> str:
        return self.tap.field

    @property
    def convention(self) -> str:
        return self.tap.convention


DFLASH_FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat(
            "zlab", "hf", ("zlab", "zlab"), False, "z-lab dflash/model.py extract_context_feature; vllm qwen3_dflash.py"
        ),
        BlockFormat(
            "sglang",
            "hf",
            ("sglang", "sglang"),
            True,
            "sglang srt/speculative/dflash_utils.py parse_dflash_draft_config; srt/models/dflash.py",
        ),
        BlockFormat(
            "vllm",
            "speculators",
            ("vllm", "speculators"),
            False,
            "speculators models/dflash/config.py; vllm transformers_utils/configs/speculators/algos.py",
        ),
    )
}
register_part("dflash", "block_formats", DFLASH_FORMATS)  # the DFlash family record's formats
BLOCK_ALIASES = {"speculators": "vllm"}


def is_block_family(family: str) -> bool:
    """A family whose drafts are written in block-drafter formats (its record has them)."""
    return family in FAMILIES and FAMILIES[family].has("block_formats")


def block_format(family: str, name: str) -> BlockFormat:
    if not is_block_family(family):
        raise CheckpointError(
            f"no block-drafter formats for family {family!r}",
            expected=", ".join(f.name for f in families_with("block_formats")),
            found=family,
        )
    formats: dict[str, BlockFormat] = get_family(family).part("block_formats")
    record = formats.get(BLOCK_ALIASES.get(name, name))
    if record is None:
        raise CheckpointError(
            f"{family} drafts have no {name!r} format",
            found=name,
            expected=", ".join([*formats, *BLOCK_ALIASES]),
            fix="pick one of the formats listed (native is eaglewire's own checkpoint)",
        )
    return record
