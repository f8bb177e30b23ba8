"""One engine record answers how it numbers every family's taps: the block formats, the doctor's layout readings
and `wiring translate --family` all read the engine records' rows, and each row's numbering round-trips."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from eaglewire.contract import CONVENTIONS, from_engine, to_engine
from eaglewire.doctor.block_inspect import LAYOUT_IDS, layout_ids
from eaglewire.errors import CheckpointError, TranslationError
from eaglewire.export.block_formats import DFLASH_FORMATS
from eaglewire.export.engines import ENGINE_FORMATS, ENGINES, block_fields, engine_for, engine_field

SRC = Path(__file__).parents[2] / "src" / "eaglewire"


def test_every_row_names_a_convention_and_its_engine_serves_the_family():
    for engine in ENGINES.values():
        for row in engine.block_fields:
            assert row.convention in CONVENTIONS and row.family in engine.families
        for family in engine.families[1 if engine.serves_eagle3 else 0 :]:
            assert engine.convention_for(None, family) == engine.fields(family)[0].convention


def test_formats_and_layouts_read_the_engine_rows():
    for fmt in DFLASH_FORMATS.values():
        row = engine_field(*fmt.reads, fmt.family)
        assert (fmt.ids_at, fmt.convention) == (row.field, row.convention)
    for layout, reads in LAYOUT_IDS.items():
        row = engine_field(*reads, "dflash")
        assert layout_ids(layout) == (row.field, row.convention)


def test_a_block_only_engine_is_no_eagle3_format():
    assert "zlab" not in ENGINE_FORMATS and "zlab" in ENGINES
    with pytest.raises(CheckpointError, match="zlab serves no eagle3 drafts"):
        engine_for("zlab")
    assert engine_for("zlab", family="dflash").convention_for(None, "dflash") == "zlab"


def test_only_the_engine_records_write_tap_rows():
    """EngineField rows are built in export/engines.py only: no second place numbers an engine's taps."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "EngineField":
                found.append(path.relative_to(SRC).as_posix())
    assert set(found) == {"export/engines.py"}


@given(st.integers(4, 80), st.data())
def test_every_row_round_trips_the_taps_it_can_express(num_layers, data):
    rows = [r for family in ("dflash",) for r in block_fields(family)]
    row = data.draw(st.sampled_from(rows))
    taps = tuple(sorted(data.draw(st.sets(st.integers(0, num_layers), min_size=1, max_size=5))))
    try:
        ids = to_engine(taps, row.convention, num_layers)
    except TranslationError:
        conv = CONVENTIONS[row.convention]  # refused only outside what the engine can capture
        assert taps[0] < conv.min_boundary or (taps[-1] == num_layers and not conv.reaches_final)
        return
    assert from_engine(ids, row.convention, num_layers) == taps
