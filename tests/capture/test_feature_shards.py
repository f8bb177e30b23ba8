"""Feature shards against their manifest: a missing, extra, cut, edited or inconsistent shard is refused with a
clear error naming it — by `train`'s reader and by `data inspect`, which share it — and a failed `train`
writes no run. The mutation test damages shards and manifests at random (bytes, tensors, metadata).

CI runs CASES generated directories (plus the 12 named damages below)."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from test_mutated_files import _mutate_bytes
from tiny import tiny_samples
from typer.testing import CliRunner

from eaglewire.capture.features import OfflineFeatures, capture_features
from eaglewire.cli.app import app
from eaglewire.draft.vocab import VocabMap, save_vocab
from eaglewire.errors import EaglewireError
from eaglewire.digests import sampled_digest

CASES = 20
TAPS = (1, 2, 3)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny target on disk (real tokenizer), its features in 3 shards (4, 4, 2 samples), a vocab map."""
    from test_server import _tiny_target_dir

    from eaglewire.target.loader import load_target

    d = tmp_path_factory.mktemp("shards")
    tdir = _tiny_target_dir(d)
    target = load_target(str(tdir))
    contract = target.contract(TAPS)
    capture_features(target, contract, tiny_samples(10), d / "feat", pad_id=0, shard_samples=4, dtype=torch.float32)
    save_vocab(
        d / "v.safetensors",
        VocabMap.from_target_ids(torch.arange(0, 256), target.vocab_size),
        torch.ones(target.vocab_size, dtype=torch.long),
        {},
    )
    return {"dir": d, "target": tdir, "contract": contract, "feat": d / "feat"}


def _copy(made, into: Path) -> Path:
    shutil.copytree(made["feat"], into / "feat")
    return into / "feat"


def _rewrite(feat: Path, shard: str, edit, keep_digest: bool = False) -> None:
    """Rewrite one shard's tensors/metadata through `edit(tensors, metadata)`, then record the new file's
    digest in the manifest (so the layout check, not the digest, must catch the damage)."""
    path = feat / shard
    with safe_open(str(path), framework="pt") as f:
        tensors, md = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    edit(tensors, md)
    save_file(tensors, str(path), metadata=md)
    if not keep_digest:
        manifest = json.loads((feat / "manifest.json").read_text())
        for sh in manifest["shards"]:
            if sh["file"] == shard:
                sh["digest"] = sampled_digest(path)
        (feat / "manifest.json").write_text(json.dumps(manifest))


def _set(key, fn):
    return lambda t, md: t.__setitem__(key, fn(t[key]))


def _more_ids(t, md):
    md["sample_ids"] = json.dumps(json.loads(md["sample_ids"]) + ["extra"])


def _manifest(fn):
    def apply(feat):
        m = json.loads((feat / "manifest.json").read_text())
        fn(m)
        (feat / "manifest.json").write_text(json.dumps(m))

    return apply


S1 = "shard-00001.safetensors"
DAMAGES = {  # name -> (what it does to a copy of the directory, the file the error must name)
    "missing": (lambda f: (f / S1).unlink(), S1),
    "extra": (lambda f: shutil.copy(f / S1, f / "shard-00007.safetensors"), "shard-00007.safetensors"),
    "cut": (lambda f: (f / S1).write_bytes((f / S1).read_bytes()[:-100]), S1),
    "edited byte": (lambda f: (f / S1).write_bytes(_flip((f / S1).read_bytes(), -7)), S1),
    "another width": (lambda f: _rewrite(f, S1, _set("taps", lambda x: torch.cat([x, x[:, :5]], 1))), S1),
    "ids longer than the shard": (lambda f: _rewrite(f, S1, _more_ids), S1),
    "offsets past the data": (
        lambda f: _rewrite(f, S1, _set("offsets", lambda o: o + torch.tensor([0] * (len(o) - 1) + [9]))),
        S1,
    ),
    "falling offsets": (lambda f: _rewrite(f, S1, _set("offsets", lambda o: o.flip(0))), S1),
    "rows disagree": (lambda f: _rewrite(f, S1, _set("loss_mask", lambda x: x[:-1])), S1),
    "float token ids": (lambda f: _rewrite(f, S1, _set("input_ids", lambda x: x.float())), S1),
    "edited, digest kept": (lambda f: _rewrite(f, S1, _set("final_hidden", lambda x: x * 2), True), S1),
    "manifest tokens": (_manifest(lambda m: m.__setitem__("tokens", m["tokens"] + 1)), "manifest.json"),
}


def _flip(raw: bytes, i: int) -> bytes:
    return raw[:i] + bytes([raw[i] ^ 0x40]) + raw[i + 1 :] if raw[i + 1 :] else raw[:i] + bytes([raw[i] ^ 0x40])


def _refused_by_inspect(feat: Path, name: str) -> None:
    r = CliRunner().invoke(app, ["data", "inspect", str(feat), "--no-target"])
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and name in "".join(r.output.split()), r.output
    for field in ("expected:", "found:", "fix:"):
        assert field in r.output


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_shard_is_refused_naming_it_by_train_and_inspect(made, tmp_path, damage):
    feat = _copy(made, tmp_path)
    do, name = DAMAGES[damage]
    do(feat)
    with pytest.raises(EaglewireError) as err:
        OfflineFeatures(feat, made["contract"], pad_id=0)
    assert name in str(err.value) and err.value.expected and err.value.found and err.value.fix
    _refused_by_inspect(feat, name)


def test_the_intact_directory_passes_both(made, tmp_path):
    feat = _copy(made, tmp_path)
    assert len(OfflineFeatures(feat, made["contract"], pad_id=0).sample_ids()) == 10
    r = CliRunner().invoke(app, ["data", "inspect", str(feat), "--no-target"])
    assert r.exit_code == 0, r.output


def test_train_on_a_damaged_shard_exits_2_and_writes_no_run(made, tmp_path):
    feat = _copy(made, tmp_path)
    DAMAGES["offsets past the data"][0](feat)
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--target",
            str(made["target"]),
            "--features",
            str(feat),
            "--vocab",
            str(made["dir"] / "v.safetensors"),
            "--out",
            str(out),
            "--max-steps",
            "1",
        ],
    )
    assert r.exit_code == 2 and "Traceback" not in r.output and S1 in "".join(r.output.split()), r.output
    assert not out.exists()


def test_a_smaller_recapture_into_the_same_out_drops_its_own_stale_shards(made, tmp_path):
    from eaglewire.target.loader import load_target

    feat = _copy(made, tmp_path)
    target = load_target(str(made["target"]))
    capture_features(target, made["contract"], tiny_samples(5), feat, pad_id=0, shard_samples=4, dtype=torch.float32)
    assert sorted(p.name for p in feat.glob("shard-*")) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert len(OfflineFeatures(feat, made["contract"], pad_id=0).sample_ids()) == 5


@settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_mutated_feature_directory(made, data):
    """Bytes of a shard or the manifest flipped, cut or inserted: refused naming the file, or (the manifest
    still meaning the same) accepted; never a traceback, never trained on a shard that changed."""
    with tempfile.TemporaryDirectory() as d:
        feat = _copy(made, Path(d))
        name = data.draw(st.sampled_from(["manifest.json", "shard-00000.safetensors", "shard-00002.safetensors"]))
        before = (feat / name).read_bytes()
        (feat / name).write_bytes(_mutate_bytes(before, data))
        changed = (feat / name).read_bytes() != before
        try:
            OfflineFeatures(feat, made["contract"], pad_id=0).batch(tiny_samples(2))
            assert name == "manifest.json" or not changed  # a changed shard is never served
        except EaglewireError as err:
            assert name in str(err) and err.expected and err.found and err.fix
        r = CliRunner().invoke(app, ["data", "inspect", str(feat), "--no-target"])
        assert r.exit_code in (0, 2) and "Traceback" not in r.output, (r.output, r.exception)
        assert r.exit_code == 0 or name in "".join(r.output.split())


def test_a_resumed_capture_recaptures_a_shard_changed_since_it_was_recorded(made, tmp_path):
    from eaglewire.target.loader import load_target

    feat = _copy(made, tmp_path)
    DAMAGES["edited, digest kept"][0](feat)  # same layout and ids, other numbers
    target = load_target(str(made["target"]))
    capture_features(target, made["contract"], tiny_samples(10), feat, pad_id=0, shard_samples=4, dtype=torch.float32)
    with safe_open(str(feat / S1), framework="pt") as a, safe_open(str(made["feat"] / S1), framework="pt") as b:
        assert torch.equal(a.get_tensor("final_hidden"), b.get_tensor("final_hidden"))  # captured again
    assert len(OfflineFeatures(feat, made["contract"], pad_id=0).sample_ids()) == 10
