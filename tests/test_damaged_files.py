"""Every reader of untrusted files, fed a table of damaged files: each one ends in the project's
what / expected / found / fix error naming the file (exit code 2 through the CLI), never a traceback, and
no pickle is ever run (the pickles below would create a marker file when unpickled)."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_draft, build_target, tiny_samples
from typer.testing import CliRunner

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.cli.app import app
from eaglewire.errors import EaglewireError

MARKER = "PICKLE-RAN"


class _Payload:
    """Unpickling this opens (creates) the marker file: proof that a pickle was run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# ------------------------------------------------------------------------------------------- damages
# Each takes the file to damage and the test's tmp dir, and rewrites the file in place.


def _truncated(p: Path, _: Path) -> None:
    p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size // 2)])


def _empty(p: Path, _: Path) -> None:
    p.write_bytes(b"")


def _four_bytes(p: Path, _: Path) -> None:
    p.write_bytes(b"\x00\x01\x02\x03")


def _wrong_magic(p: Path, _: Path) -> None:
    p.write_bytes(b"GIF89a not what you think " * 40)


def _absurd_header(p: Path, _: Path) -> None:
    p.write_bytes(struct.pack("<Q", 1 << 62) + b"{}" + b"\x00" * 64)


def _pickle(p: Path, tmp: Path) -> None:
    p.write_bytes(pickle.dumps(_Payload(tmp / MARKER)))


def _torch_save(p: Path, tmp: Path) -> None:
    torch.save({"w": _Payload(tmp / MARKER)}, p)


def _missing(p: Path, _: Path) -> None:
    p.unlink()


def _not_utf8(p: Path, _: Path) -> None:
    p.write_bytes(b'{"a": "\xff\xfe"}')


def _json_list(p: Path, _: Path) -> None:
    p.write_text("[1, 2, 3]")


def _json_garbage(p: Path, _: Path) -> None:
    p.write_text('{"format": ')


def _deep(p: Path, _: Path) -> None:
    p.write_text("[" * 100_000 + "]" * 100_000)


def _edit(**changes):
    """A JSON edit: dotted keys set to values (wrong JSON types, zero/negative sizes)."""

    def damage(p: Path, _: Path) -> None:
        data = json.loads(p.read_text())
        for dotted, value in changes.items():
            node = data
            *parents, last = dotted.split(".")
            for part in parents:
                node = node[part]
            node[last] = value
        p.write_text(json.dumps(data))

    damage.__name__ = "edit " + ", ".join(f"{k}={v!r}" for k, v in changes.items())
    return damage


def _tensor(key: str, value: float):
    def damage(p: Path, _: Path) -> None:
        t = load_file(str(p))
        t[key] = t[key].clone()
        t[key].view(-1)[0] = value
        save_file(t, str(p), metadata={"format": "eaglewire.draft/1"})

    damage.__name__ = f"{key} {value}"
    return damage


def _float_d2t(p: Path, _: Path) -> None:
    t = load_file(str(p))
    t["d2t"] = t["d2t"].float()
    save_file(t, str(p))


BINARY = [_truncated, _empty, _four_bytes, _wrong_magic, _absurd_header, _pickle, _torch_save, _missing]
JSON = [_truncated, _empty, _not_utf8, _json_list, _json_garbage, _deep, _pickle, _missing]


# ------------------------------------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One healthy copy of every artifact kind; each case copies what it damages."""
    from eaglewire.capture.features import capture_features
    from eaglewire.data.regenerate import append_records, check_meta
    from eaglewire.export.convert import export_draft
    from eaglewire.draft.vocab import VocabMap, save_vocab

    root = tmp_path_factory.mktemp("healthy")
    target = build_target("llama", layers=8)
    draft, contract = build_draft(target, taps=(2, 4, 5))
    save_checkpoint(draft, contract, root / "native")
    export_draft(draft, contract, root / "sglang", "sglang")
    vmap = VocabMap(d2t=draft.d2t.clone(), t2d=draft.t2d.clone())
    save_vocab(root / "vocab.safetensors", vmap, torch.zeros(target.vocab_size), {"data": "tiny"})
    capture_features(target, contract, tiny_samples(8), root / "feat", pad_id=0, shard_samples=4)
    check_meta(root / "regen.jsonl.gz", {"target": "tiny"})  # writes its settings side file (first, as the command)
    append_records(root / "regen.jsonl.gz", [{"id": "a", "messages": []}])
    (root / "run.yaml").write_text("train:\n  max_steps: 3\n")
    target.model.save_pretrained(root / "target")
    return root, target, contract


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
    return dst


# reader name -> (artifact copied, file damaged inside it, how the reader is called)
def _readers(target, contract) -> dict[str, tuple[str, str, Callable[[Path], object]]]:
    from eaglewire.capture.features import OfflineFeatures
    from eaglewire.data.regenerate import check_meta, read_done
    from eaglewire.doctor.checks import run_checks
    from eaglewire.capture.boundary_file import load_dump
    from eaglewire.doctor.inspect import inspect_dir
    from eaglewire.export.convert import import_draft
    from eaglewire.pipeline.config import resolve
    from eaglewire.target.loader import load_target
    from eaglewire.draft.vocab import load_vocab

    return {
        "native weights": ("native", "model.safetensors", lambda d: load_checkpoint(d, target=target)),
        "native config": ("native", "config.json", lambda d: load_checkpoint(d, target=target)),
        "import weights": ("sglang", "model.safetensors", lambda d: import_draft(d, "sglang")),
        "import config": ("sglang", "config.json", lambda d: import_draft(d, "sglang")),
        "import contract": ("sglang", "eaglewire_contract.json", lambda d: import_draft(d, "sglang")),
        "doctor weights": ("sglang", "model.safetensors", lambda d: run_checks(inspect_dir(d, None), target)),
        "doctor config": ("sglang", "config.json", lambda d: run_checks(inspect_dir(d, None), target)),
        "vocab map": ("vocab.safetensors", "", load_vocab),
        "feature manifest": ("feat", "manifest.json", lambda d: OfflineFeatures(d, contract, pad_id=0)),
        "feature shard": ("feat", "shard-00001.safetensors", lambda d: OfflineFeatures(d, contract, pad_id=0)),
        "boundaries dump": ("vocab.safetensors", "", load_dump),  # any file damaged into a dump's place
        "run config": ("run.yaml", "", lambda p: resolve(config=p)),
        "target config": ("target", "config.json", lambda d: load_target(str(d), with_tokenizer=False)),
        "regeneration file": ("regen.jsonl.gz", "", lambda p: read_done(p, repair=True)),
        "regeneration settings": (
            "regen.jsonl.gz.meta.json",
            "",
            lambda p: check_meta(p.with_name("regen.jsonl.gz"), {"target": "tiny"}),
        ),
    }


# the doctor reports missing weights as findings (test_doctor_refuses_zero_heads_...), not as an error
CASES = [
    (reader, d)
    for reader in (
        "native weights",
        "import weights",
        "doctor weights",
        "vocab map",
        "feature shard",
        "boundaries dump",
    )
    for d in BINARY
    if (reader, d) != ("doctor weights", _missing)
]
CASES += [
    (reader, d)
    for reader in (
        "native config",
        "import config",
        "import contract",
        "doctor config",
        "feature manifest",
        "run config",
        "target config",
    )
    for d in JSON
]
CASES += [("regeneration file", d) for d in (_wrong_magic, _pickle, _torch_save, _not_utf8)]
CASES += [("regeneration settings", d) for d in JSON if d is not _missing]  # missing: written afresh
CASES += [  # wrong JSON types per field, zero/negative sizes
    ("native config", _edit(draft=None)),
    ("native config", _edit(**{"draft.hidden_size": "64"})),
    ("native config", _edit(**{"draft.num_attention_heads": 0})),
    ("native config", _edit(dtype=7)),
    ("native config", _edit(**{"contract.taps": "1,2,3"})),
    ("native config", _edit(**{"draft.vocab_size": -5})),
    ("import config", _edit(hidden_size="64")),
    ("import config", _edit(num_attention_heads=0)),
    ("import config", _edit(draft_vocab_size=-1)),
    ("import config", _edit(norm_output="false")),
    ("doctor config", _edit(hidden_size="64")),
    ("doctor config", _edit(**{"eagle_config": None})),
    ("doctor config", _edit(rms_norm_eps="tiny")),
    ("doctor config", _edit(num_key_value_heads=True)),
    ("import contract", _edit(taps="1,2,3")),
    ("import contract", _edit(target=None)),
    ("feature manifest", _edit(shards={})),
    ("feature manifest", _edit(**{"contract.taps": "1,2,3"})),
    ("feature manifest", _edit(shards=[{"file": "../../etc/passwd", "samples": 1, "tokens": 1}])),
    ("feature manifest", _edit(shards=[{"file": "shard-00000.safetensors", "samples": -1, "tokens": 1}])),
    ("native weights", _tensor("fc.weight", float("inf"))),
    ("native weights", _tensor("fc.weight", float("-inf"))),
    ("native weights", _tensor("norm.weight", float("nan"))),
    ("import weights", _tensor("fc.weight", float("inf"))),
]


@pytest.mark.parametrize("reader,damage", CASES, ids=[f"{r}-{d.__name__.strip('_')}" for r, d in CASES])
def test_damaged_file_is_refused_cleanly(made, tmp_path, reader, damage):
    root, target, contract = made
    artifact, inner, read = _readers(target, contract)[reader]
    copy = _copy(root / artifact, tmp_path / artifact)
    victim = copy / inner if inner else copy
    damage(victim, tmp_path)
    with pytest.raises(EaglewireError) as err:
        read(copy)
    e = err.value
    assert e.expected and e.found and e.fix, str(e)
    named = {victim.name, str(victim), str(copy), copy.name}
    assert any(n in str(e) for n in named), f"{reader}: the message does not name the file:\n{e}"
    assert not (tmp_path / MARKER).exists(), "a pickle was run"


def test_doctor_refuses_zero_heads_and_shapes_against_the_config(made, tmp_path):
    """Values of the right type that describe no model, or weights of another shape: doctor errors."""
    from eaglewire.doctor.checks import run_checks
    from eaglewire.doctor.inspect import inspect_dir

    root, target, _ = made
    heads = _copy(root / "sglang", tmp_path / "heads")
    _edit(num_attention_heads=0)(heads / "config.json", tmp_path)
    with pytest.raises(EaglewireError, match="num_attention_heads"):  # the value import refuses (one validation)
        inspect_dir(heads, None)
    wide = _copy(root / "sglang", tmp_path / "wide")
    _edit(intermediate_size=96)(wide / "config.json", tmp_path)
    errors = [f.what for f in run_checks(inspect_dir(wide, None), target).findings if f.level == "error"]
    assert any("gate_proj.weight has shape" in w for w in errors) and any("down_proj" in w for w in errors)
    gone = _copy(root / "sglang", tmp_path / "gone")
    _missing(gone / "model.safetensors", tmp_path)
    assert any(
        "lm_head.weight is missing" in f.what
        for f in run_checks(inspect_dir(gone, None), target).findings
        if f.level == "error"
    )
    floats = _copy(root / "sglang", tmp_path / "floats")
    _float_d2t(floats / "model.safetensors", tmp_path)
    found = run_checks(inspect_dir(floats, None), target).findings
    assert any(f.check == "d2t" and "not int64" in f.what for f in found)


def test_hostile_pytorch_model_bin_target_gets_our_error(made, tmp_path):
    from eaglewire.target.loader import load_target

    root, _, _ = made
    target_dir = tmp_path / "target"
    target_dir.mkdir()
    (target_dir / "config.json").write_text((root / "target" / "config.json").read_text())
    for damage in (_pickle, _torch_save):
        damage(target_dir / "pytorch_model.bin", tmp_path)
        with pytest.raises(EaglewireError) as err:
            load_target(str(target_dir), with_tokenizer=False)
        assert str(target_dir) in str(err.value) and err.value.fix
        assert "weights_only=False" not in str(err.value)  # transformers' advice to run the pickle
        assert not (tmp_path / MARKER).exists()


CLI_CASES = [
    ("import", "sglang", "model.safetensors", _truncated, lambda d, o: ["import", d, "--format", "sglang", "--out", o]),
    ("import", "sglang", "config.json", _json_list, lambda d, o: ["import", d, "--format", "sglang", "--out", o]),
    ("doctor", "sglang", "model.safetensors", _pickle, lambda d, o: ["doctor", d, "--no-measure"]),
    ("doctor", "sglang", "config.json", _edit(hidden_size="64"), lambda d, o: ["doctor", d, "--no-measure"]),
    ("data inspect", "feat", "manifest.json", _json_garbage, lambda d, o: ["data", "inspect", d, "--no-target"]),
    ("data inspect", "feat", "shard-00000.safetensors", _missing, lambda d, o: ["data", "inspect", d, "--no-target"]),
]


@pytest.mark.parametrize(
    "name,artifact,inner,damage,args", CLI_CASES, ids=[f"{c[0]}-{c[2]}-{c[3].__name__.strip('_')}" for c in CLI_CASES]
)
def test_cli_exit_code_2_with_the_file_named(made, tmp_path, name, artifact, inner, damage, args):
    root, _, _ = made
    copy = _copy(root / artifact, tmp_path / artifact)
    damage(copy / inner, tmp_path)
    argv = [str(a) for a in args(copy, tmp_path / "out")]
    if name == "doctor":
        argv += ["--target", str(root / "target")]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output and "expected:" in r.output and "fix:" in r.output
    assert inner in r.output or str(copy) in r.output.replace("\n", "")
    assert not (tmp_path / MARKER).exists()


def test_regeneration_file_gzip_of_garbage_names_offset_zero(tmp_path):
    from eaglewire.data.regenerate import read_done

    p = tmp_path / "r.jsonl.gz"
    p.write_bytes(gzip.compress(b"not json at all\n", mtime=0))
    with pytest.raises(EaglewireError, match="byte offset 0"):
        read_done(p)
