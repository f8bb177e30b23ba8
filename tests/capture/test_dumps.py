"""Hidden-state dumps from SpecForge and speculators: imported into feature shards equal to our own capture,
named by inspect (the seeds' [embed, l3, l31] case as [0, 1, 2] stored where [1, 2, 3] was declared on a
4-layer target), and refused when damaged — naming the file, with nothing half-written into the output.

Tolerance of "equal": shards stored in fp32 match capture_features' within 1e-5 (the same fp32 forward, one
batched with padding, one not); target_top1 is identical.
"""

import importlib.util
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
from dump_writers import (
    client_python,
    run_client,
    save_specforge_sample,
    write_specforge,
    write_speculators_arrow,
    write_speculators_states,
)
from safetensors.torch import load_file
from tiny import build_target, tiny_samples

from eaglewire.capture.dumps import import_dump, open_dump
from eaglewire.capture.dumps.report import inspect_dump
from eaglewire.capture.features import OfflineFeatures, capture_features
from eaglewire.errors import ContractMismatch, EaglewireError

TAPS = (1, 2, 3)  # boundaries of the 4-layer tiny target; SpecForge ids [0, 1, 2], vLLM/speculators [1, 2, 3]
SHIFTED = (0, 1, 2)  # the seeds' case: the embedding and the inputs of the declared layers
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
needs_arrow = pytest.mark.skipif(
    not HAS_PYARROW,
    reason="pyarrow is not installed: reading speculators' Arrow dataset needs it (pip install 'eaglewire[dumps]')",
)


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=4)


@pytest.fixture(scope="module")
def samples():
    return tiny_samples(5, seed=1)


def _assert_same_features(imported: Path, reference: Path, target, samples) -> None:
    contract = target.contract(TAPS)
    a, b = OfflineFeatures(imported, contract, 0), OfflineFeatures(reference, contract, 0)
    ids_a = [s.id for s in a.samples()]
    for sa, sb in zip(a.samples(), samples):
        assert torch.equal(sa.input_ids, sb.input_ids) and torch.equal(sa.loss_mask, sb.loss_mask)
    fa, fb = a.batch(a.samples()), b.batch(samples)  # what training gets from each directory
    for name in ("taps", "final_hidden"):
        torch.testing.assert_close(getattr(fa, name), getattr(fb, name), rtol=1e-5, atol=1e-5)
    assert torch.equal(fa.target_top1, fb.target_top1) and torch.equal(fa.loss_mask, fb.loss_mask)
    assert len(ids_a) == len(samples)


def _reference(tmp_path, target, samples) -> Path:
    ref = tmp_path / "reference"
    capture_features(target, target.contract(TAPS), samples, ref, pad_id=0, shard_samples=2, dtype=torch.float32)
    return ref


# --------------------------------------------------------------------------------------------------
# healthy dumps
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True], ids=["ckpt", "ckpt.gz"])
def test_specforge_import_equals_our_capture(tmp_path, target, samples, compress):
    write_specforge(tmp_path / "dump", target, samples, TAPS, compress=compress, group=3)  # 2 rows_* folders
    manifest = import_dump(
        tmp_path / "dump", "specforge", target, tmp_path / "feat", taps=[0, 1, 2], shard_samples=2, dtype=torch.float32
    )
    assert manifest["contract"]["taps"] == list(TAPS)  # SpecForge ids [0, 1, 2] -> boundaries [1, 2, 3]
    assert manifest["source"]["format"] == "specforge" and manifest["source"]["verified_samples"] == 2
    assert manifest["samples"] == 5 and len(manifest["shards"]) == 3
    _assert_same_features(tmp_path / "feat", _reference(tmp_path, target, samples), target, samples)


def test_specforge_reads_our_test_dump_as_we_do(tmp_path, target, samples):
    """SpecForge's own lister and loader read the helper's files; our reader gets the same tensors."""
    py = client_python("specforge")
    if py is None:
        pytest.skip("SpecForge client venv absent (bash scripts/specforge_venv.sh)")
    write_specforge(tmp_path / "dump", target, samples[:3], TAPS)
    out = tmp_path / "specforge-read.safetensors"
    run_client(py, "specforge_read_dump.py", str(tmp_path / "dump"), str(out))
    theirs, dump = load_file(str(out)), open_dump(tmp_path / "dump", "auto")
    assert dump.format == "specforge"
    for sid in dump.ids():
        s = dump.read(sid)
        assert theirs[f"{sid}.ckpt|aux_hidden_state"].shape == (1, len(s.input_ids), 3 * target.hidden_size)
        assert torch.equal(theirs[f"{sid}.ckpt|aux_hidden_state"][0], s.taps.flatten(1))
        assert torch.equal(theirs[f"{sid}.ckpt|hidden_state"][0], s.last)
        assert torch.equal(theirs[f"{sid}.ckpt|input_ids"], s.input_ids)


@needs_arrow
def test_speculators_import_equals_our_capture(tmp_path, target, samples):
    dump = tmp_path / "dump"
    write_speculators_states(dump, target, samples, TAPS, skip=[4])  # row 4: not generated (--max-samples)
    check = write_speculators_arrow(dump, samples, real_tool=True)
    if check is not None:  # speculators' own ArrowDataset read the dump: our reader must agree with it
        theirs, reader = load_file(str(check)), open_dump(dump, "speculators")
        for sid in reader.ids():
            s, i = reader.read(sid), sid.removeprefix("row-")
            assert torch.equal(theirs[f"{i}|hidden_states"], s.taps.flatten(1))
            assert torch.equal(theirs[f"{i}|verifier_last_hidden_states"], s.last)
            assert torch.equal(theirs[f"{i}|loss_mask"], s.loss_mask)
        assert "4|hidden_states" not in theirs
    manifest = import_dump(
        dump, "auto", target, tmp_path / "feat", taps=[1, 2, 3, 4], shard_samples=2, dtype=torch.float32
    )  # vLLM ids incl. the last layer (--include-last-layer)
    assert manifest["contract"]["taps"] == list(TAPS) and manifest["samples"] == 4
    assert manifest["source"]["rows_without_states"] == 1
    assert manifest["source"]["last_state"] == "pre-norm + target final norm"
    _assert_same_features(tmp_path / "feat", _reference(tmp_path, target, samples[:4]), target, samples[:4])


@needs_arrow
def test_speculators_states_written_elsewhere(tmp_path, target, samples):
    """speculators' generate step writes hs_*.safetensors to its --output when given: --states-dir reads them."""
    import shutil

    dump = tmp_path / "dump"
    write_speculators_states(dump, target, samples[:3], TAPS)
    write_speculators_arrow(dump, samples[:3], real_tool=False)
    shutil.move(str(dump / "hidden_states"), str(tmp_path / "elsewhere"))
    with pytest.raises(EaglewireError, match="no samples with hidden states"):
        import_dump(dump, "speculators", target, tmp_path / "none", taps=[1, 2, 3, 4])
    manifest = import_dump(
        dump,
        "speculators",
        target,
        tmp_path / "feat",
        taps=[1, 2, 3, 4],
        dtype=torch.float32,
        states_dir=tmp_path / "elsewhere",
    )
    assert manifest["samples"] == 3
    _assert_same_features(tmp_path / "feat", _reference(tmp_path, target, samples[:3]), target, samples[:3])
    with pytest.raises(EaglewireError, match="speculators layout"):
        open_dump(dump, "specforge", tmp_path / "elsewhere")


def test_import_resumes_and_keeps_finished_shards(tmp_path, target, samples):
    write_specforge(tmp_path / "dump", target, samples, TAPS)
    kw = dict(taps=[0, 1, 2], shard_samples=2)
    import_dump(tmp_path / "dump", "specforge", target, tmp_path / "feat", **kw)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "feat").glob("shard-*")}
    (tmp_path / "feat" / "shard-00001.safetensors").unlink()  # as if killed during shard 1
    import_dump(tmp_path / "dump", "specforge", target, tmp_path / "feat", **kw)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "feat").glob("shard-*")}
    assert after["shard-00000.safetensors"] == mtimes["shard-00000.safetensors"]
    assert after.keys() == mtimes.keys()
    with pytest.raises(ContractMismatch, match="another wiring contract"):  # other taps into the same dir
        import_dump(tmp_path / "dump", "specforge", target, tmp_path / "feat", taps=[0, 1, 3], verify=0)


# --------------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------------


def test_inspect_without_target_reports_shapes_tokens_coverage_nans(tmp_path, target, samples):
    paths = write_specforge(tmp_path / "dump", target, samples, TAPS, dtype=torch.bfloat16)
    data = torch.load(paths[2], weights_only=True)
    data["aux_hidden_state"][0, 3, :5] = float("nan")
    save_specforge_sample(paths[2], data)
    rep = inspect_dump(tmp_path / "dump")
    assert rep.format == "specforge" and rep.samples == rep.scanned == 5
    assert rep.tokens == sum(len(s.input_ids) for s in samples)
    assert rep.loss_tokens == sum(int(s.loss_mask.sum()) for s in samples)
    assert rep.num_taps == 3 and rep.hidden_size == target.hidden_size
    assert rep.dtypes["taps"] == "bfloat16" and rep.nonfinite == {"taps": 5, "last": 0}
    assert not rep.ok and "non-finite values: 5 in taps" in rep.findings[0]
    assert "not identified (pass a target)" in "\n".join(rep.lines())


def test_inspect_healthy_dump_names_every_state(tmp_path, target, samples):
    write_specforge(tmp_path / "dump", target, samples, TAPS)
    rep = inspect_dump(tmp_path / "dump", "specforge", target, declared_taps=[0, 1, 2])
    assert rep.ok, rep.findings
    assert rep.declared == [1, 2, 3] and rep.found_taps == [1, 2, 3]
    assert [s.found for s in rep.stored] == [1, 2, 3, "post-norm"]
    text = "\n".join(rep.lines())
    assert "aux_hidden_state[:, 0]: 1 — output of decoder layer 0" in text
    assert "hidden_state: post-norm — the final-norm output" in text


def test_inspect_names_the_seeds_shifted_dump_specforge(tmp_path, target, samples):
    """[embed, l3, l31] stored where [l3, l31, l59] was meant: here [0, 1, 2] where [1, 2, 3] is declared."""
    write_specforge(tmp_path / "dump", target, samples, SHIFTED)
    rep = inspect_dump(tmp_path / "dump", "specforge", target, declared_taps=[0, 1, 2])
    assert not rep.ok and rep.found_taps == [0, 1, 2] and rep.declared == [1, 2, 3]
    assert "the dump's taps are boundaries [0 (embedding), 1, 2]; declared [1, 2, 3]" in rep.findings[0]
    assert "one boundary early" in rep.findings[0] and "embedding was stored as a tap" in rep.findings[0]
    assert rep.stored[0].meaning == "embedding output"
    with pytest.raises(ContractMismatch, match=r"\[0 \(embedding\), 1, 2\]; declared \[1, 2, 3\]") as err:
        import_dump(tmp_path / "dump", "specforge", target, tmp_path / "feat", taps=[0, 1, 2])
    assert "data_0.ckpt" in str(err.value) and not (tmp_path / "feat").exists()


@needs_arrow
def test_inspect_names_the_seeds_shifted_dump_speculators(tmp_path, target, samples):
    dump = tmp_path / "dump"
    write_speculators_states(dump, target, samples[:2], SHIFTED)  # + boundary 4 appended, as vLLM does
    write_speculators_arrow(dump, samples[:2])
    rep = inspect_dump(dump, "auto", target, declared_taps=[1, 2, 3], taps_from="vllm")
    assert rep.format == "speculators" and rep.found_taps == [0, 1, 2]
    assert [s.found for s in rep.stored][-1] == 4  # the last layer, pre-norm, as speculators stores it
    assert "[0 (embedding), 1, 2]; declared [1, 2, 3]" in rep.findings[0]


def test_inspect_single_state_and_wrong_side_of_the_norm(tmp_path, target, samples):
    write_specforge(tmp_path / "one", target, samples[:2], (4,))  # aux capture off: one state
    rep = inspect_dump(tmp_path / "one", "specforge", target, declared_taps=[0, 1, 2])
    assert rep.num_taps == 1 and any("ONE" in f for f in rep.findings)
    with pytest.raises(ContractMismatch, match="ONE state where 3 taps were expected"):
        import_dump(tmp_path / "one", "specforge", target, tmp_path / "feat", taps=[0, 1, 2])
    write_specforge(tmp_path / "pre", target, samples[:2], TAPS, last="pre-norm")
    rep = inspect_dump(tmp_path / "pre", "specforge", target, declared_taps=[0, 1, 2])
    assert rep.found_taps == [1, 2, 3] and rep.stored[-1].found == 4
    assert (
        "the last state is output of decoder layer 3 (the last, before the final norm), the format says "
        "the final-norm output"
    ) in rep.findings[0]


def test_inspect_our_own_feature_dir_and_another_target(tmp_path, target, samples):
    ref = _reference(tmp_path, target, samples)
    rep = inspect_dump(ref, "auto", target)
    assert rep.format == "eaglewire" and rep.ok and rep.declared == [1, 2, 3] and rep.found_taps == [1, 2, 3]
    other = build_target("llama", seed=7, layers=4)  # same shapes, other weights
    rep = inspect_dump(ref, "auto", other)
    assert not rep.ok and rep.found_taps == [None, None, None]
    assert rep.stored[0].meaning == "matches no boundary of this target"


# --------------------------------------------------------------------------------------------------
# damaged dumps: a clear error naming the file, nothing half-written
# --------------------------------------------------------------------------------------------------


class Exploit:  # what a hostile .ckpt would pickle; weights_only refuses to build it
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:200])


def _pickle_object(path: Path) -> None:
    data = torch.load(path, weights_only=True)
    data["extra"] = Exploit()
    torch.save(data, path, pickle_module=pickle)


def _mismatched_lengths(path: Path) -> None:
    data = torch.load(path, weights_only=True)
    data["input_ids"] = torch.cat([data["input_ids"], torch.tensor([1, 2])])  # e.g. written padded
    torch.save(data, path)


def _nan(path: Path) -> None:
    data = torch.load(path, weights_only=True)
    data["hidden_state"][0, 1, 0] = float("nan")
    torch.save(data, path)


CORRUPTIONS = {
    "truncated": (_truncate, "cannot be read (truncated", "a complete torch.save file"),
    "pickled-object": (_pickle_object, "refused: the file needs more than weights_only", "posix.system"),
    "lengths": (_mismatched_lengths, "disagree on the number of positions", "input_ids: "),
    "nan": (_nan, "non-finite hidden states", "1 NaN/Inf in last state"),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_damaged_specforge_sample_is_refused_naming_the_file(tmp_path, target, samples, case):
    corrupt, what, detail = CORRUPTIONS[case]
    paths = write_specforge(tmp_path / "dump", target, samples, TAPS)
    corrupt(paths[3])  # shard 1 (samples 2-3): shard 0 is written whole first
    out = tmp_path / "feat"
    with pytest.raises(EaglewireError) as err:
        import_dump(tmp_path / "dump", "specforge", target, out, taps=[0, 1, 2], shard_samples=2)
    msg = str(err.value)
    assert str(paths[3]) in msg and what in msg and detail in msg and "expected:" in msg
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000.safetensors"]  # no manifest, no temp file
    assert load_file(str(out / "shard-00000.safetensors"))["offsets"].tolist()[-1] == sum(
        len(s.input_ids) for s in samples[:2]
    )
    write_specforge(tmp_path / "dump", target, samples, TAPS)  # repaired: the import resumes and completes
    assert import_dump(tmp_path / "dump", "specforge", target, out, taps=[0, 1, 2], shard_samples=2)["samples"] == 5


def test_specforge_reader_never_runs_a_pickled_payload(tmp_path, target, samples, capfd):
    paths = write_specforge(tmp_path / "dump", target, samples[:1], TAPS)
    _pickle_object(paths[0])
    rep = inspect_dump(tmp_path / "dump")
    assert not rep.ok and "posix.system" in rep.errors[0] and "pwned" not in capfd.readouterr().out


@needs_arrow
@pytest.mark.parametrize("case", ["truncated", "token_ids", "lengths"])
def test_damaged_speculators_sample_is_refused_naming_the_file(tmp_path, target, samples, case):
    dump = tmp_path / "dump"
    paths = write_speculators_states(dump, target, samples[:3], TAPS)
    write_speculators_arrow(dump, samples[:3])
    bad = load_file(str(paths[1]))
    if case == "truncated":
        paths[1].write_bytes(paths[1].read_bytes()[:300])
    else:
        from safetensors.torch import save_file

        key = "token_ids" if case == "token_ids" else "hidden_states"
        bad[key] = (bad[key] + 1) if case == "token_ids" else bad[key][:-1].contiguous()
        save_file(bad, str(paths[1]))
    with pytest.raises(EaglewireError) as err:
        import_dump(dump, "speculators", target, tmp_path / "feat", taps=[1, 2, 3], shard_samples=5)
    assert "hs_1.safetensors" in str(err.value) and "expected:" in str(err.value)
    out = tmp_path / "feat"
    assert not out.exists() or not list(out.iterdir())  # the only shard was never written


def test_speculators_without_pyarrow_says_how_to_get_it(tmp_path, monkeypatch):
    (tmp_path / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    with pytest.raises(EaglewireError, match="needs pyarrow") as err:
        open_dump(tmp_path, "auto")
    assert "pip install 'eaglewire[dumps]'" in str(err.value)
