"""A new drafter family costs one record: a toy family registered here, in this file only, is saved, loaded,
decoded, exported for an engine and checked by the doctor, with no other module touched.

The toy family borrows EAGLE-3's parts (its draft class, strict loader, checkpoint tensors, proposer, directory
loader): what is proven is that every layer asks the family's record (families.py) for them by the name its
contract carries, so none of them has a table or a branch keyed by "eagle3" in the way.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny import VOCAB, build_draft, build_target

import eaglewire as ew
from eaglewire import compose
from eaglewire.decoding.engine import greedy_reference
from eaglewire.decoding.runtime import plain_runtime
from eaglewire.errors import ContractMismatch
from eaglewire.families import FAMILIES, Family, get_family, register_family, unregister_family

PROMPT = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(7))
TOY = "toy"


@pytest.fixture
def toy_family():
    import eaglewire.export.checkpoint  # noqa: F401  the layers that register EAGLE-3's parts
    import eaglewire.serve.bench  # noqa: F401

    eagle3 = get_family("eagle3")
    decoding = eagle3.part("decoding")
    record = register_family(
        Family(TOY, "a test-only family: EAGLE-3's parts under another name", block=False, title="Toy"),
        load_strict=eagle3.part("load_strict"),
        checkpoint_state=eagle3.part("checkpoint_state"),
        decoding=compose.Decoding(TOY, decoding.proposer, decoding.layout),
        bench_rows=("toy_chain",),
    )
    yield record
    unregister_family(TOY)


def test_a_new_family_is_one_record(toy_family, tmp_path):
    target = build_target("llama")
    draft, base = build_draft(target)
    contract = replace(base, family=TOY)  # the contract validates its family against the registry
    draft.contract = contract

    native = ew.export_draft(draft, tmp_path / "native", "native", contract=contract)  # saved: its part
    loaded = ew.load_draft(native, target)  # loaded: its strict loader
    assert loaded.contract.family == TOY and loaded.contract == contract

    dec = ew.decoder(target, loaded, ew.TreeShape.chain(3), 16, context=40, accelerate=False)  # decoded
    out, stats = dec.generate(PROMPT, 16)
    assert out == greedy_reference(plain_runtime(target, 64), PROMPT, 16) and stats.tau >= 1.0

    vllm = ew.export_draft(loaded, tmp_path / "vllm", "vllm")  # exported for an engine, read back
    again = ew.load_draft(vllm, target)  # its decoding's layout, the engine's reader
    assert again.contract.family == TOY and torch.equal(again.fc.weight, draft.fc.weight)
    report = ew.check(vllm, "vllm", target)  # checked
    assert report.errors == 0, report.to_json()

    from eaglewire.serve.bench import family_rows, rows_for

    assert family_rows()[TOY] == ("toy_chain",) and rows_for(TOY, ("vanilla",)) == ("vanilla", "toy_chain")


def test_an_unregistered_family_is_refused_by_name():
    assert TOY not in FAMILIES
    target = build_target("llama")
    _, base = build_draft(target)
    with pytest.raises(ContractMismatch, match="unknown drafter family 'toy'"):
        replace(base, family=TOY)


# Tables whose keys look like family names but are not the family axis: the norm presets ("eagle3" = the
# published norms), the doctor's readings of other tools' block drafters (families eaglewire does not
# implement: dflash2, dspark), the benchmark's rows by method ("dflash" = the method row).
ALLOWED_FAMILY_TABLES = frozenset({"families.py", "norms.py", "doctor/block_inspect.py", "serve/bench.py"})


def _family_keyed_tables(allowed: frozenset[str]) -> list[str]:
    """Dict literals keyed by a built-in family's name in modules not `allowed` (parsed, not imported)."""
    import ast
    from pathlib import Path

    src = Path(__file__).parents[1] / "src" / "eaglewire"
    out = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value in ("eagle3", "dflash") for k in node.keys
            ):
                out.append(f"{rel}:{node.lineno}")
    return out


def test_no_module_keeps_a_table_keyed_by_a_family_name():
    """Each layer registers its part on the family's record (families.register_part) instead of keeping a table
    keyed by the name, so a new family is one record and no row in another module."""
    assert _family_keyed_tables(ALLOWED_FAMILY_TABLES) == []
    assert any(row.startswith("norms.py") for row in _family_keyed_tables(frozenset()))  # the scan sees one
