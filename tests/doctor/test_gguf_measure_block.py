"""A DFlash GGUF's wiring measured from its own weights (doctor/gguf_measure.py through measured_block.py's
block score and the one rule), as a DFlash directory's is: the draft trained by test_measured_block.py on
TRAINED (random-token data, so it must read its taps), exported with `export --format llamacpp`, no contract
beside it. The GGUF with the right target_layers measures to its taps; one whose target_layers were rewritten
(z-lab's numbering, the converter's +1 never applied; every tap one layer late) gets the error naming TRAINED."""

import pytest
from llamacpp_gguf import rewrite
from test_measured_block import TRAINED, bounds, target, trained  # noqa: F401  (the trained draft's fixtures)

from eaglewire.contract import to_engine
from eaglewire.doctor.gguf_inspect import inspect_gguf
from eaglewire.doctor.gguf_measure import run_gguf_measurement
from eaglewire.export.gguf_draft import export_gguf
from eaglewire.export.llamacpp_layout import DFLASH

L = 8
KEY = DFLASH.key("{arch}.target_layers")


@pytest.fixture(scope="module")
def base(trained, tmp_path_factory):  # noqa: F811
    draft, contract = trained
    path = export_gguf(draft, contract, tmp_path_factory.mktemp("dflash-gguf") / "e") / "draft.gguf"
    (path.parent / "eaglewire_contract.json").unlink()  # the weights are the only evidence of the taps
    return path


def test_the_dflash_family_is_measured():
    assert DFLASH.measured and DFLASH.block


def test_a_dflash_gguf_with_its_trained_ids_measures_to_its_taps(target, bounds, base):  # noqa: F811
    assert inspect_gguf(base, target).draft.target_layers == list(to_engine(TRAINED, "llamacpp", L))
    m, (f,) = run_gguf_measurement(inspect_gguf(base, target), target, bounds=bounds)
    assert m.delivered == m.best == TRAINED and f.level == "info", m.to_dict()
    assert "block NLL" in f.what and "teacher-forced tau of a round" in f.what  # the block drafter's own score
    assert m.tau["best"] == m.tau["delivered"] and m.tau["best"][0] > 1.5 and len(m.tau["best"][1]) == 3


@pytest.mark.parametrize(
    "ids,delivered",
    [
        ([1, 4, 6], (1, 4, 6)),  # z-lab's ids written as they are: the converter's +1 lost, every tap one layer early
        ([3, 6, 8], None),  # each tap one layer late: id 8 = n_layer, an input DFlash's graph does not have
    ],
)
def test_a_dflash_gguf_with_wrong_target_layers_gets_the_error(
    target,
    bounds,
    base,
    tmp_path,
    ids,  # noqa: F811
    delivered,
):
    path = rewrite(base, tmp_path / "wrong" / "draft.gguf", set_keys={KEY: ids})
    m, (f,) = run_gguf_measurement(inspect_gguf(path, target), target, bounds=bounds)
    assert m.best == TRAINED and f.level == "error", m.to_dict()
    if delivered is not None:
        assert m.delivered == delivered and m.gap[1] > 0.05 and m.tau["best"][0] > m.tau["delivered"][0]
        assert f"will deliver {list(delivered)}" in f.what
    assert f"predicts best from boundaries {list(TRAINED)}" in f.what
    assert f"write {KEY} = {list(to_engine(TRAINED, 'llamacpp', L))}" in f.fix
