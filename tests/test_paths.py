"""Every path a command is given goes through eaglewire.paths (check_path / resolve_path): over a space of paths
built from files, folders, missing names, symlink loops (a link to itself, two links to each other), dangling
links, links through links, a path through a file, a folder this user may not search and names too long,
each path is either accepted (and resolves) or refused with an EaglewireError naming it, never a RuntimeError or
an OSError; and the commands (export, import, vocab build, data show) answer each with a clear error, exit 2,
no traceback. OSError escaping a command becomes os_error's message (errno, path, fix)."""

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.errors import EaglewireError
from eaglewire.paths import check_path, os_error, resolve_path

NOBODY = 65534
PARTS = ("file", "dir", "missing", "self_loop", "loop_a", "dangling", "to_file", "to_dir", "chain", "locked",
         "x" * 300, "..", ".")


@pytest.fixture(scope="module")
def tree():
    """A folder every user may search, holding one of each kind of entry (`locked` only root may search)."""
    root = Path(tempfile.mkdtemp(prefix="ew-paths-"))
    os.chmod(root, 0o755)
    (root / "file").write_text("{}")
    (root / "dir").mkdir()
    (root / "locked").mkdir(mode=0o000)
    (root / "locked" / "inner").touch()
    os.symlink("self_loop", root / "self_loop")
    os.symlink("loop_b", root / "loop_a")
    os.symlink("loop_a", root / "loop_b")
    os.symlink("nowhere", root / "dangling")
    os.symlink("file", root / "to_file")
    os.symlink("dir", root / "to_dir")
    os.symlink("to_dir", root / "chain")
    yield root
    os.chmod(root / "locked", 0o755)
    shutil.rmtree(root)


@contextmanager
def _as(uid: int | None):
    """Run the block with effective uid `uid` (root ignores permissions; another user meets them)."""
    if uid is None or os.geteuid() != 0:
        yield
        return
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


paths = st.lists(st.sampled_from(PARTS), min_size=1, max_size=3)


def _stat_errno(p: Path) -> int | None:
    try:
        os.stat(p)
    except OSError as err:
        return err.errno
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=paths, unprivileged=st.booleans())
def test_every_path_is_accepted_or_refused_with_a_clear_error(tree, parts, unprivileged):
    p = tree.joinpath(*parts)
    with _as(NOBODY if unprivileged else None):
        fault = _stat_errno(p)
        try:
            real = resolve_path(p, "--draft")
        except EaglewireError as err:
            msg = str(err)
            assert str(p) in msg and "--draft" in msg and "fix:" in msg, msg
            if fault == errno.ELOOP:
                assert "symlink loop" in msg
            elif fault == errno.EACCES:
                assert "permission denied" in msg
            elif fault == errno.ENOENT:
                assert "dangling symlink" in msg and os.path.islink(p)
            else:
                assert fault is not None, f"an existing, reachable path refused: {msg}"
        else:
            # accepted: reachable (or simply missing, which each command words itself), and resolved
            assert fault in (None, errno.ENOENT) and not (fault == errno.ENOENT and os.path.islink(p))
            assert real.is_absolute() and ".." not in real.parts


COMMANDS = (
    lambda p, out: ["export", p, "-f", "vllm", "--out", out],
    lambda p, out: ["import", p, "-f", "vllm", "--out", out],
    lambda p, out: ["vocab", "build", "--data", p, "--out", out, "--draft-vocab-size", "8"],
    lambda p, out: ["data", "show", "--data", p],
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inp=paths, out=paths, command=st.sampled_from(COMMANDS))
def test_commands_answer_every_bad_path_with_a_clear_error(tree, tmp_path, inp, out, command):
    """An input and an --out drawn from the space: exit 2 with an error (these are never a draft, a data
    file or a usable output), never a traceback, and no file outside the output is touched."""
    before = sorted(str(q) for q in tree.rglob("*") if "locked" not in q.parts)
    args = command(str(tree.joinpath(*inp)), str(tree.joinpath(*out, "o") if out[-1] == "dir" else
                                               tree.joinpath(*out)))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit), \
        (args, result.output, result.exception)
    assert "Traceback" not in result.output and "error:" in result.output and "Usage:" not in result.output, \
        result.output
    assert sorted(str(q) for q in tree.rglob("*") if "locked" not in q.parts) == before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EADDRINUSE, errno.EIO,
                                  errno.EXDEV])
def test_os_errors_become_messages_naming_the_path_and_the_fault(code):
    err = os_error(OSError(code, os.strerror(code), "/some/out/model.safetensors"), "--out")
    msg = str(err)
    assert isinstance(err, EaglewireError) and "/some/out/model.safetensors" in msg and "--out" in msg
    assert errno.errorcode[code] in msg and "fix:" in msg


def test_a_missing_path_is_left_to_the_command():
    assert check_path("/no/such/place", "--data") == Path("/no/such/place")
