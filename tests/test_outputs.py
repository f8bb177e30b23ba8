"""No command destroys what it did not create (eaglewire.outputs, the one writer of output folders and the one
lock on outputs): an existing folder that is not the writer's own earlier output is refused and left byte for
byte as it was; `--force` replaces it but never an input, a folder holding one or the working directory; a
replacement killed at any point leaves the old output or the new one, and the next write cleans up; a second
writer is refused naming the first, and a killed holder's lock is free again."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import build_draft, build_target
from typer.testing import CliRunner

from eaglewire import outputs
from eaglewire.cli.app import app
from eaglewire.errors import EaglewireError
from eaglewire.export.checkpoint import save_checkpoint

NAMES = ("model.safetensors", "config.json")
CASES = 40  # generated cases per property test in CI (each a few ms: no model is built)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _owned(d: Path) -> bool:
    return (d / "config.json").is_file() and b"ours" in (d / "config.json").read_bytes()


def _fill(tag: bytes):
    def fill(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(tag * 100)
        (tmp / "config.json").write_bytes(b'{"ours": "' + tag + b'"}')

    return fill


name = st.text("abcxyz._-", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
trees = st.dictionaries(
    st.lists(name, min_size=1, max_size=3).map(tuple), st.binary(max_size=64), min_size=1, max_size=6
)


def _write_tree(root: Path, tree: dict) -> None:
    for parts, data in tree.items():
        p = root.joinpath(*parts)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        except (IsADirectoryError, NotADirectoryError, FileExistsError):
            pass  # one drawn path is a folder of another: keep the first


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees)
def test_a_folder_the_writer_did_not_make_is_refused_and_untouched(tree):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        out.mkdir()
        _write_tree(out, tree)
        owned = set(_snapshot(out)) <= set(NAMES) and _owned(out)
        before = _snapshot(out)
        if owned:  # the drawn tree happens to be an earlier output: replacing it is the point
            outputs.replace_dir(out, _fill(b"n"), names=NAMES, owned=_owned)
            return
        with pytest.raises(EaglewireError) as err:
            outputs.replace_dir(out, _fill(b"n"), names=NAMES, owned=_owned)
        e = err.value
        assert e.expected and e.found and "--force" in e.fix and str(out) in e.what
        assert _snapshot(out) == before and sorted(p.name for p in Path(d).iterdir()) == ["out"]
        outputs.replace_dir(out, _fill(b"n"), names=NAMES, owned=_owned, force=True)
        assert _snapshot(out) == {"model.safetensors": b"n" * 100, "config.json": b'{"ours": "n"}'}


@settings(max_examples=CASES, deadline=None)
@given(depth=st.integers(0, 3), force=st.booleans())
def test_never_the_input_a_folder_holding_it_or_the_working_directory(depth, force):
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d).joinpath(*[f"p{i}" for i in range(3)], "input")
        inp.mkdir(parents=True)
        (inp / "config.json").write_bytes(b'{"ours": "input"}')
        out = inp
        for _ in range(depth):
            out = out.parent
        before = _snapshot(Path(d))
        with pytest.raises(EaglewireError, match="input"):
            outputs.replace_dir(out, _fill(b"n"), names=NAMES, owned=lambda p: True, force=force, inputs=(inp,))
        cwd = os.getcwd()
        os.chdir(inp)
        try:
            for o in (Path("."), Path(".."), Path(d)):
                with pytest.raises(EaglewireError, match="working directory"):
                    outputs.replace_dir(o, _fill(b"n"), names=NAMES, owned=lambda p: True, force=force)
        finally:
            os.chdir(cwd)
        assert _snapshot(Path(d)) == before


class Killed(BaseException):
    """What a kill looks like to the code after it: nothing runs."""


@settings(max_examples=CASES, deadline=None)
@given(kill_at=st.integers(0, 6), had_old=st.booleans())
def test_a_replacement_killed_anywhere_leaves_old_or_new_and_the_next_write_cleans_up(kill_at, had_old):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        if had_old:
            outputs.replace_dir(out, _fill(b"o"), names=NAMES, owned=_owned)
        old = _snapshot(out) if had_old else None
        calls = {"n": 0}
        real_rename, real_remove = os.rename, outputs._remove

        def tick():
            calls["n"] += 1
            if calls["n"] > kill_at:
                raise Killed

        def rename(a, b):
            tick()
            real_rename(a, b)

        def fill(tmp):
            (tmp / "model.safetensors").write_bytes(b"n" * 50)
            tick()
            (tmp / "model.safetensors").write_bytes(b"n" * 100)
            tick()
            (tmp / "config.json").write_bytes(b'{"ours": "n"}')

        outputs.os.rename = rename
        outputs._remove = lambda p: (tick(), real_remove(p))
        try:
            try:
                with _no_cleanup():
                    outputs.replace_dir(out, fill, names=NAMES, owned=_owned)
                finished = True
            except Killed:
                finished = False
        finally:
            outputs.os.rename, outputs._remove = real_rename, real_remove
        new = {"model.safetensors": b"n" * 100, "config.json": b'{"ours": "n"}'}
        if out.exists():
            assert _snapshot(out) in (old, new)
        else:
            assert not had_old or not finished
        # the next write recovers: the old output back if it was swapped out, no temp folder left
        with outputs.output_lock(out):
            outputs.recover(out)
        if had_old and not (out.exists() and _snapshot(out) == new):
            assert _snapshot(out) == old
        assert [p.name for p in Path(d).iterdir()] in ([], ["out"])


class _no_cleanup:
    """A kill runs no `finally`: the temp folder stays, as after a real SIGKILL."""

    def __enter__(self):
        self.rmtree = outputs.shutil.rmtree
        outputs.shutil.rmtree = lambda p: None

    def __exit__(self, *exc):
        outputs.shutil.rmtree = self.rmtree


# -------------------------------------------------------------------------------------------- locks


HOLD = """
import sys, time
from eaglewire.outputs import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_holders_lock_is_free(tmp_path):
    out = tmp_path / "regen.jsonl.gz"
    p = _holder(out)
    try:
        with pytest.raises(EaglewireError) as err:
            with outputs.output_lock(out):
                pass
        assert f"pid {p.pid}" in err.value.found and "being written by another process" in err.value.what
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    with outputs.output_lock(out):  # the kernel released it with the process
        with outputs.output_lock(out):  # re-entrant within one process (a command calling a library writer)
            pass
    assert not outputs.lock_path(out).exists()


def test_two_runs_into_one_output_one_is_refused_and_the_file_is_untouched(tmp_path):
    """`data regenerate`, `train` and `run` hold their output's lock: the second is refused before it writes."""
    from eaglewire.data.regenerate import GenerationSettings, regenerate
    from eaglewire.pipeline.runner import run_pipeline
    from eaglewire.train.loop import train

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("first run's")
    p = _holder(out)
    try:
        for call in (
            lambda: regenerate("x", out, None, GenerationSettings(), limit=1),
            lambda: train(None, None, None, None, [], [], None, out),
            lambda: run_pipeline(None, out, progress=None, log=None),
        ):
            with pytest.raises(EaglewireError, match=f"pid {p.pid}"):
                call()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    assert _snapshot(out) == {"keep": b"first run's"}


# --------------------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    draft, contract = build_draft(build_target("llama"), num_layers=1)
    return save_checkpoint(draft, contract, tmp_path_factory.mktemp("ckpt") / "native")


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_export_and_import_refuse_foreign_folders_inputs_and_the_working_directory(checkpoint, tmp_path, monkeypatch):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    for cmd in (
        ("export", checkpoint, "--format", "vllm"),
        ("export", checkpoint, "--format", "native"),
        ("import", checkpoint, "--format", "native"),
    ):
        r = _cli(*cmd, "--out", user)
        assert r.exit_code == 2 and "notes.txt" in r.output and "--force" in r.output, r.output
    assert _snapshot(user) == {"notes.txt": b"mine"}
    before = _snapshot(checkpoint)
    for force in ((), ("--force",)):
        r = _cli("export", checkpoint, "--format", "native", "--out", checkpoint, *force)
        assert r.exit_code == 2 and "input" in r.output, r.output
        r = _cli("export", checkpoint, "--format", "vllm", "--out", checkpoint.parent, *force)
        assert r.exit_code == 2 and "input" in r.output, r.output
        monkeypatch.chdir(user)
        r = _cli("export", checkpoint, "--format", "vllm", "--out", ".", *force)
        assert r.exit_code == 2 and "working directory" in r.output, r.output
        monkeypatch.chdir(tmp_path)
    assert _snapshot(checkpoint) == before and _snapshot(user) == {"notes.txt": b"mine"}
    # its own earlier export is replaced; --force replaces the user's folder when asked to
    assert _cli("export", checkpoint, "--format", "vllm", "--out", tmp_path / "e").exit_code == 0
    assert _cli("export", checkpoint, "--format", "vllm", "--out", tmp_path / "e").exit_code == 0
    assert _cli("export", checkpoint, "--format", "vllm", "--out", user, "--force").exit_code == 0
    assert "notes.txt" not in _snapshot(user) and (user / "eaglewire_contract.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "mine"]  # no temp folder or lock left
