"""The Python front door (`import eaglewire as ew`): its names, loaded lazily; decoding assembled once, by
drafter family; any draft directory loaded with its contract; the doctor as a function; the package
data a typed library ships."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from proposers import OracleProposer
from tiny import VOCAB, build_draft, build_target

import eaglewire as ew
from eaglewire import compose, families
from eaglewire.decoding.engine import greedy_reference
from eaglewire.decoding.runtime import plain_runtime

ROOT = Path(__file__).parents[1]
PROMPT = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))


def test_every_name_of_the_front_door_resolves_and_nothing_else_does():
    assert ew.__all__ == sorted(ew.__all__) and len(ew.__all__) >= 10
    from eaglewire import api

    assert api.__all__ is ew.__all__  # written once
    for name in ew.__all__:  # every name imports, as a user writes it
        exec(f"from eaglewire import {name}", {})
    for name in ew.__all__:
        assert getattr(ew, name) is not None
    assert set(ew.__all__) <= set(dir(ew))
    with pytest.raises(AttributeError, match="no attribute 'decode'"):
        ew.decode  # noqa: B018
    import eaglewire.export  # noqa: F401  the subpackages load: the front door's names stay functions
    import eaglewire.train  # noqa: F401
    assert callable(ew.export_draft) and callable(ew.train_draft)


def test_the_command_line_package_does_not_load_the_front_door():
    code = ("import sys, eaglewire.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('eaglewire.api', 'eaglewire.compose', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_package_ships_its_type_marker_and_guards_its_target_folder(tmp_path):
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["eaglewire"]
    assert (ROOT / "src" / "eaglewire" / "py.typed").is_file()
    # a global gitignore's `target/` (Rust, Maven) must not hide the target package from git
    excludes = tmp_path / "global-gitignore"
    excludes.write_text("target/\n")
    r = subprocess.run(["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q",
                        "src/eaglewire/target/loader.py"], cwd=ROOT, capture_output=True)
    assert r.returncode == 1, "src/eaglewire/target/ is ignored under a global `target/` entry"
    r = subprocess.run(["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q", "rust/target/x"],
                       cwd=ROOT, capture_output=True)
    assert r.returncode == 0  # the check itself can fail: other target/ folders stay ignored


def test_the_decoder_sizes_its_cache_and_decodes_losslessly():
    target = build_target("llama")
    draft, contract = build_draft(target)
    draft.contract = contract
    shape = ew.TreeShape(num_steps=3, topk=2, num_draft_tokens=5)
    dec = ew.decoder(target, draft, shape, 24, context=PROMPT.shape[1] + 24, accelerate=False)
    assert dec.rt.max_len == compose.cache_len(PROMPT.shape[1] + 24, shape) == PROMPT.shape[1] + 24 + 5 + 8
    out, stats = dec.generate(PROMPT, 24)
    assert out == greedy_reference(plain_runtime(target, 64), PROMPT, 24)
    pooled = ew.measure_tau(target, draft, [PROMPT, PROMPT[:, :5]], shape, 12, eos=set())
    assert len(pooled.accepted) > 0 and 1.0 <= pooled.tau <= shape.num_steps + 1


def test_a_second_family_is_one_registration(monkeypatch, tmp_path):
    """decoder() and load_draft() pick the proposer and the export layout by the contract's family: a family
    registered here decodes (an oracle proposer) and its export's layout is its record's, without a branch in
    any caller."""
    target = build_target("llama")
    ref = greedy_reference(plain_runtime(target, 64), PROMPT, 16)
    calls: list[str] = []

    def propose(draft, contract, shape, max_len, rt):
        calls.append(f"propose {contract.family}")
        return OracleProposer(ref, shape)

    def layout(config, side):
        calls.append(f"layout {config['architectures'][0]} {side.family}")
        return "vllm"

    # the contract names only families with a record (families.py); decoding and loading are its decoding part
    monkeypatch.setitem(families.FAMILIES, "toy", families.Family("toy", "a test family", False))
    compose.register(compose.Decoding("toy", propose, layout))
    _, base = build_draft(target)
    contract = _with_family(base, "toy")
    draft = type("ToyDraft", (), {"contract": contract})()
    out, _ = ew.decoder(target, draft, ew.TreeShape.chain(3), 16, context=40, accelerate=False).generate(PROMPT, 16)
    assert out == ref and calls == ["propose toy"]
    d = tmp_path / "toy-draft"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["ToyDraft"]}')
    (d / "eaglewire_contract.json").write_text(json.dumps(contract.to_dict()))
    assert compose.draft_layout(d) == "vllm" and calls[-1] == "layout ToyDraft toy"
    with pytest.raises(Exception, match="no drafter family 'nope'"):
        compose.family_of({"family": "nope"})


def _with_family(contract, family: str):
    """The contract carrying `family` (a field once block drafters land; an attribute until then)."""
    try:
        return replace(contract, family=family)
    except TypeError:
        obj = type("FamilyContract", (), {})()
        obj.__dict__.update(contract.__dict__, family=family)
        return obj


def test_load_draft_reads_any_format_and_check_is_the_doctor(tmp_path):
    target = build_target("llama")
    draft, contract = build_draft(target)
    native = ew.export_draft(draft, tmp_path / "native", "native", contract=contract)
    loaded = ew.load_draft(native, target)
    assert loaded.contract == contract and loaded.fc.weight.dtype == torch.float32
    vllm = ew.export_draft(loaded, tmp_path / "vllm", "vllm")
    again = ew.load_draft(vllm, target)
    assert again.contract == contract and torch.equal(again.fc.weight, draft.fc.weight)
    report = ew.check(vllm, None, target)  # the engine detected from config.json, as the CLI does
    assert isinstance(report, ew.Report) and report.engine == "vllm" and report.errors == 0, report.to_json()
    broken = ew.check(vllm, "sglang", target)  # the wrong engine for this layout: the doctor says so
    assert broken.errors > 0
