"""The CLI imports a command's module only when that command runs: arithmetic commands stay torch-free."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import typer.main

from eaglewire.cli import app as cli_app

SRC = str(Path(cli_app.__file__).resolve().parents[2])

# runs one command in a fresh interpreter, then reports which heavy packages that run imported
PROBE = """
import json, sys
from eaglewire.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    print(json.dumps({m: m in sys.modules for m in ("torch", "transformers", "numpy")}))
"""


def _heavy_imports(*args: str) -> dict[str, bool]:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_wiring_translate_imports_neither_torch_nor_transformers():
    found = _heavy_imports("wiring", "translate", "--to", "vllm", "-L", "30", "--arch", "LlamaForCausalLM", "--json")
    assert found == {"torch": False, "transformers": False, "numpy": False}


def test_wiring_conventions_and_help_stay_torch_free():
    assert not _heavy_imports("wiring", "conventions")["torch"]
    assert not _heavy_imports("wiring", "translate", "--help")["torch"]


def test_the_command_table_is_what_the_modules_register_in_the_eager_apps_order():
    # a command added to a module but not to COMMAND_MODULES (or listed under the wrong module, or in
    # another place of `eaglewire --help` than an eagerly built app gives it) fails here
    eager = typer.Typer()
    for module in ("target", "formats", "doctor", "data", "train", "decoding", "run"):
        importlib.import_module(f"eaglewire.cli.{module}").register(eager)
    want = list(typer.main.get_group(eager).commands)
    registered = {n: m for m in set(cli_app.COMMAND_MODULES.values()) for n in cli_app.module_commands(m)}
    assert registered == cli_app.COMMAND_MODULES
    assert list(typer.main.get_command(cli_app.app).commands) == want


def test_a_lookup_loads_only_the_named_commands_module():
    commands = cli_app.LazyCommands({})
    assert "wiring" in commands and "nope" not in commands and not commands._loaded
    assert commands["wiring"].name == "wiring"
    assert set(commands._loaded) == {n for n, m in cli_app.COMMAND_MODULES.items() if m == "target"}
    assert commands.get("nope") is None
