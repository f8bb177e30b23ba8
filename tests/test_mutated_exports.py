"""Exports and native weights, mutated (bytes of any file, a config or contract value, a tensor of the
wrong shape or dtype), through the commands that read them (`import`, `export`): each ends in success or in
one clean error (exit 2, no traceback, the export named), and a failed command writes no output.

CI runs CASES generated exports and CASES generated native weight files."""

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
from test_mutated_files import _mutate_bytes, _mutate_json
from tiny import build_draft, build_target
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.export.checkpoint import save_checkpoint

CASES = 20
SETTINGS = settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
FORMATS = ("vllm", "sglang")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("exports")
    draft, contract = build_draft(build_target("llama"), num_layers=1)
    native = save_checkpoint(draft, contract, d / "native")
    for fmt in FORMATS:
        r = CliRunner().invoke(app, ["export", str(native), "--format", fmt, "--out", str(d / fmt)])
        assert r.exit_code == 0, r.output
    return d


def _mutate_tensors(path: Path, data) -> None:
    """One tensor cut, widened, retyped, dropped, or an extra one added (a file that still parses)."""
    with safe_open(str(path), framework="pt") as f:
        tensors, md = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    key = data.draw(st.sampled_from(sorted(tensors)))
    kind = data.draw(st.sampled_from(["cut", "widen", "retype", "drop", "extra", "nan"]))
    t = tensors[key]
    if kind == "cut" and t.dim():
        tensors[key] = t[: max(t.shape[0] - 1, 0)].contiguous()
    elif kind == "widen":
        tensors[key] = torch.cat([t.reshape(-1), t.reshape(-1)[:1]]) if t.numel() else t
    elif kind == "retype":
        tensors[key] = t.to(torch.int32 if t.is_floating_point() else torch.float32)
    elif kind == "drop":
        del tensors[key]
    elif kind == "extra":
        tensors["extra.weight"] = torch.zeros(3)
    elif kind == "nan" and t.is_floating_point() and t.numel():
        tensors[key] = t.clone()
        tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, str(path), metadata=md)


def _damage(directory: Path, data) -> str:
    """Damage one file of `directory`; returns its name."""
    name = data.draw(st.sampled_from(sorted(p.name for p in directory.iterdir())))
    path = directory / name
    if name.endswith(".json"):
        obj = json.loads(path.read_text())
        path.write_bytes(_mutate_json(obj, data, sorted(obj)))
    elif data.draw(st.booleans()):
        _mutate_tensors(path, data)
    else:
        path.write_bytes(_mutate_bytes(path.read_bytes(), data))
    return name


def _clean(r, names: tuple[str, ...]) -> None:
    assert r.exit_code in (0, 2), (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and not (r.exception and not isinstance(r.exception, SystemExit))
    if r.exit_code == 2:
        flat = "".join(r.output.split())
        assert any(n in flat for n in names), r.output


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(FORMATS))
def test_a_mutated_export_is_imported_or_refused_and_writes_nothing(made, data, fmt):
    with tempfile.TemporaryDirectory() as d:
        exp = Path(d) / "exp"
        shutil.copytree(made / fmt, exp)
        name = _damage(exp, data)
        out = Path(d) / "native"
        r = CliRunner().invoke(app, ["import", str(exp), "--format", fmt, "--out", str(out), "--no-measure"])
        _clean(r, (name, str(exp)))
        assert r.exit_code == 0 or not out.exists()


@SETTINGS
@given(data=st.data())
def test_mutated_native_weights_are_exported_or_refused_and_write_nothing(made, data):
    with tempfile.TemporaryDirectory() as d:
        native = Path(d) / "native"
        shutil.copytree(made / "native", native)
        weights = native / "model.safetensors"
        if data.draw(st.booleans()):
            _mutate_tensors(weights, data)
        else:
            weights.write_bytes(_mutate_bytes(weights.read_bytes(), data))
        out = Path(d) / "out"
        r = CliRunner().invoke(
            app, ["export", str(native), "--format", data.draw(st.sampled_from(FORMATS)), "--out", str(out)]
        )
        _clean(r, ("model.safetensors", str(native)))
        assert r.exit_code == 0 or not out.exists()
