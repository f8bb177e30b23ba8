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
from hypothesis import given, settings
from hypothesis import strategies as st
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
    for name in ew.__all__:  # each documented in its own words (a dataclass's generated doc repeats its signature)
        doc = getattr(ew, name).__doc__
        assert doc and doc.strip() and not doc.startswith(f"{name}("), f"ew.{name} has no docstring"
    assert set(ew.__all__) <= set(dir(ew))
    with pytest.raises(AttributeError, match="no attribute 'decode'"):
        ew.decode  # noqa: B018
    import eaglewire.export  # noqa: F401  the subpackages load: the front door's names stay functions
    import eaglewire.train  # noqa: F401

    assert callable(ew.export_draft) and callable(ew.train_draft)
    from eaglewire import workflows

    assert ew.train_draft is workflows.train_draft  # one function, one name: the CLI's and `eaglewire run`'s


# Front-door names a lower module also defines as another function, until they are merged (issue 59: one loader;
# training's own `evaluate`; the doctor's `@check` decorator went when its checks became explicit lists). The list
# only shrinks: a name merged must leave it.
DEFINED_TWICE = {"evaluate", "export_draft", "load_target"}


def test_each_front_door_name_has_one_meaning():
    """No name of __all__ is defined (def, class, assignment) by a second module as something else, beyond the
    listed ones; `train_draft` once meant workflows.train in the front door and another function beside it."""
    import ast

    defined: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "eaglewire").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = (
                [node.name]
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                else [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            )
            for name in set(names) & set(ew.__all__):
                defined.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert set(defined) == set(ew.__all__)  # each defined somewhere: the scan sees them
    twice = {name for name, where in defined.items() if len(where) > 1}
    assert twice - DEFINED_TWICE == set(), {n: defined[n] for n in twice - DEFINED_TWICE}
    assert DEFINED_TWICE - twice == set(), f"merged now: drop {DEFINED_TWICE - twice} from DEFINED_TWICE"


def test_the_command_line_package_does_not_load_the_front_door():
    code = (
        "import sys, eaglewire.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('eaglewire.api', 'eaglewire.compose', 'torch'))))"
    )
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
    r = subprocess.run(
        ["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q", "src/eaglewire/target/loader.py"],
        cwd=ROOT,
        capture_output=True,
    )
    assert r.returncode == 1, "src/eaglewire/target/ is ignored under a global `target/` entry"
    r = subprocess.run(
        ["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q", "rust/target/x"],
        cwd=ROOT,
        capture_output=True,
    )
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


# --- the front door speaks text ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory):
    """A tiny random Llama on disk with the real SmolLM2 tokenizer and chat template, and a native draft for it."""
    from test_server import _tiny_target_dir

    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.target.loader import load_target

    d = tmp_path_factory.mktemp("chat")
    tdir = _tiny_target_dir(d)
    draft, contract = build_draft(load_target(str(tdir)), taps=(1, 2, 3))
    save_checkpoint(draft, contract, d / "draft")
    return tdir, d / "draft"


def _chat_greedy(target, prompt: str, n: int, eos: set[int]) -> list[int]:
    ids = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    return greedy_reference(plain_runtime(target, 256), ids, n, eos=eos)


def test_generate_renders_the_chat_prompt_and_equals_the_command_line(chat_dirs, monkeypatch):
    import dataclasses
    import json

    from typer.testing import CliRunner

    from eaglewire import generation
    from eaglewire.cli.app import app

    tdir, ddir = chat_dirs
    target = ew.load_target(tdir)
    sized: list[int] = []
    monkeypatch.setattr(
        generation,
        "decoder",
        lambda *a, context, **k: sized.append(context) or compose.decoder(*a, context=context, **k),
    )
    g = ew.generate(target, ddir, "Hi.", max_new_tokens=12, draft_dtype="target", compile="never")
    eos = {target.tokenizer.eos_token_id}
    assert list(g.tokens) == _chat_greedy(target, "Hi.", 12, eos)  # lossless, on the chat-rendered prompt
    assert g.text == target.tokenizer.decode(list(g.tokens), skip_special_tokens=True)
    assert sized == [g.prompt_tokens + 12]  # the cache holds this prompt and its new tokens, no default room
    assert len(g.per_position) == g.shape.num_steps and 1.0 <= g.tau <= g.shape.num_steps + 1
    assert g.prefill_s > 0 and g.decode_s > 0 and g.tokens_per_s == len(g.tokens) / (g.prefill_s + g.decode_s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.text = "x"  # type: ignore[misc]
    as_messages = ew.generate(
        target, ddir, [{"role": "user", "content": "Hi."}], 12, draft_dtype="target", compile="never"
    )
    assert as_messages.tokens == g.tokens
    r = CliRunner().invoke(
        app,
        [
            "generate",
            "--target",
            str(tdir),
            "--draft",
            str(ddir),
            "-p",
            "Hi.",
            "--json",
            "--max-new-tokens",
            "12",
            "--draft-dtype",
            "target",
            "--compile",
            "never",
        ],
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    cli = json.loads(r.stdout)
    assert cli["text"] == g.text and tuple(cli["tokens"]) == g.tokens
    assert cli["stats"]["per_position"] == list(g.per_position) and cli["stats"]["tau"] == g.tau


def test_generate_stops_at_the_eos(chat_dirs):
    """The tokenizer's EOS ends the text, itself the last token: made EOS here, a token the target emits mid-way."""
    tdir, ddir = chat_dirs
    target = ew.load_target(tdir)
    free = _chat_greedy(target, "Count to ten.", 16, set())
    stop = free[5]
    target.tokenizer.eos_token = target.tokenizer.convert_ids_to_tokens(stop)
    assert target.tokenizer.eos_token_id == stop
    g = ew.generate(target, ddir, "Count to ten.", max_new_tokens=16, draft_dtype="target", compile="never")
    assert list(g.tokens) == free[: free.index(stop) + 1]


@settings(max_examples=200, deadline=None)  # the first example imports eaglewire.generation
@given(
    st.one_of(
        st.text(max_size=20),
        st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=20)}
            ),
            max_size=4,
        ),
        st.lists(
            st.dictionaries(
                st.sampled_from(["role", "content", "name"]), st.one_of(st.text(max_size=5), st.integers())
            ),
            max_size=3,
        ),
        st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=5)}),
        st.integers(),
        st.none(),
    )
)
def test_a_prompt_is_a_user_message_or_chat_messages_else_a_clear_error(prompt):
    from eaglewire.errors import EaglewireError
    from eaglewire.generation import messages_of

    valid = isinstance(prompt, str) or (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    )
    if not valid:
        with pytest.raises(EaglewireError, match="prompt|chat message"):
            messages_of(prompt)
        return
    got = messages_of(prompt)
    want = (
        [{"role": "user", "content": prompt}]
        if isinstance(prompt, str)
        else [{"role": m["role"], "content": m["content"]} for m in prompt]
    )
    assert got == want


def test_training_and_export_take_a_config_object(tmp_path):
    """ew.train_draft(target, taps or None, vocab, TrainConfig, out, samples=[...]) is `eaglewire train`'s
    training; ew.export_draft takes the directory it wrote and never writes over it."""
    from tiny import tiny_samples

    from eaglewire.contract import default_taps
    from eaglewire.errors import EaglewireError

    import types

    target, samples = build_target("llama", layers=8), tiny_samples(12)  # 8 layers: the default taps are distinct
    target.tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)  # what online capture pads with
    ew.build_vocab(target, samples, 64, 0.0, tmp_path / "vocab.safetensors", data="tiny")
    cfg = ew.TrainConfig(
        max_steps=2, batch_size=4, warmup_steps=1, eval_every=2, ckpt_every=2, ttt_steps=2, dtype="fp32"
    )
    heard: list[int] = []
    summary = ew.train_draft(
        target,
        None,
        tmp_path / "vocab.safetensors",
        cfg,
        tmp_path / "run",
        samples=samples,
        heldout_fraction=0.25,
        on_start=lambda c, n, h: heard.extend([n, h]),
    )
    assert tuple(summary["contract"]["taps"]) == default_taps(target.num_layers)  # None: the family's taps
    assert summary["config"]["max_steps"] == 2 and sum(heard) == len(samples) and heard[1] > 0
    out = ew.export_draft(tmp_path / "run" / "draft", tmp_path / "vllm", "vllm")
    assert (out / "config.json").is_file() and (out / "eaglewire_contract.json").is_file()
    with pytest.raises(EaglewireError, match="is the input"):  # the draft read is never the folder written
        ew.export_draft(tmp_path / "run" / "draft", tmp_path / "run", "vllm")
    with pytest.raises(EaglewireError, match="training needs data"):
        ew.train_draft(target, None, tmp_path / "vocab.safetensors", cfg, tmp_path / "none")
