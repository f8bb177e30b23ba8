"""Every stage runs on the decided device, tested on a machine without a GPU.

The bug class: on a GPU box torch's default device is the CPU while the target sits on CUDA, so a tensor made
without `device=` lands on the CPU and the stage either fails or quietly runs there. Here the roles are swapped:
the target stays on the CPU (the decided device) and torch's default device is `meta` (`wrong_default`), so any
tensor a stage makes without naming its device lands on meta, where it holds no values: the stage fails
loudly, or its output lies on meta, which the tests check. Each stage's results are also compared with the same
stage run outside the guard (greedy decoding stays lossless). The command line is tested with a recording stub:
each command hands its --device to the loader, says it first, and refuses CUDA on a machine without one.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import VOCAB, build_dflash, build_draft, build_target, tiny_samples
from typer.testing import CliRunner

from eaglewire import compose, hw
from eaglewire.capture.boundaries import sample_target
from eaglewire.capture.features import OnlineFeatures
from eaglewire.capture.hooks import capture
from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.decoding.runtime import plain_runtime
from eaglewire.decoding.tree import TreeShape
from eaglewire.errors import EaglewireError


@contextlib.contextmanager
def wrong_default():
    """torch's default device is `meta` inside: a tensor made without naming its device lands there."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _on_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


# --- the decision ------------------------------------------------------------------------------------------
def test_auto_is_cuda_where_a_gpu_is_visible_else_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hw.pick_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hw.pick_device("auto") == "cuda"
    assert hw.pick_device("cpu") == "cpu"  # an override wins over a visible GPU


def test_cuda_asked_for_without_one_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EaglewireError, match="torch sees 0 GPU") as err:
        hw.pick_device("cuda:1")
    assert "--device cpu" in str(err.value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_a_device_spelling_is_accepted_exactly_when_it_names_auto_cpu_or_a_cuda_gpu(text):
    valid = re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", text) is not None
    if valid:
        assert hw.check_device(text) == text
    else:
        with pytest.raises(EaglewireError, match="unknown device"):
            hw.check_device(text)


def test_the_run_config_field_is_the_same_knob():
    from eaglewire.pipeline.config import resolve

    assert resolve("quick").device == hw.DEVICE_DEFAULT
    assert resolve("quick", device="cuda:0").device == "cuda:0"
    with pytest.raises(EaglewireError, match="device"):
        resolve("quick", device="gpu")


def test_a_gpu_gets_bf16_by_default_the_cpu_fp32():
    assert hw.default_dtype_name("cuda:0") == "bfloat16"
    assert hw.default_dtype_name("cpu") == "float32"


# --- every stage on the decided device ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", [TreeShape.chain(3), TreeShape(num_steps=3, topk=2, num_draft_tokens=5)])
def test_eagle3_decoding_makes_every_tensor_on_the_targets_device(shape):
    target = build_target("llama")
    draft, contract = build_draft(target, taps=(1, 2, 3))
    prompt = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    ref = greedy_reference(plain_runtime(target, 64), prompt, 12)
    with wrong_default():
        rt = compose.runtime(target, 64, accelerate=False)
        out, _ = SpecDecoder(rt, compose.proposer(draft, shape, 64, rt, contract=contract)).generate(prompt, 12)
        assert greedy_reference(plain_runtime(target, 64), prompt, 12) == ref
    assert out == ref  # lossless, and nothing ran off the target's device


def test_block_decoding_makes_every_tensor_on_the_targets_device():
    target = build_target("llama")
    draft, contract = build_dflash(target, taps=(1, 2, 3))
    prompt = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(4))
    ref = greedy_reference(plain_runtime(target, 64), prompt, 12)
    with wrong_default():
        rt = compose.runtime(target, 64, accelerate=False)
        out, _ = SpecDecoder(rt, compose.proposer(draft, TreeShape.chain(3), 64, rt, contract=contract)).generate(
            prompt, 12
        )
    assert out == ref


def test_capture_and_online_features_run_where_the_target_is():
    target = build_target("llama")
    _, contract = build_draft(target, taps=(1, 2, 3))
    samples = tiny_samples(4)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))
    want = capture(target, (1, 2, 3), ids).taps
    with wrong_default():
        got = capture(target, (1, 2, 3), ids).taps
        fb = OnlineFeatures(target, contract, pad_id=0).batch(samples)
    assert _on_cpu(got, fb.taps, fb.final_hidden) and torch.equal(got, want)


def test_the_doctors_boundaries_and_engine_run_where_the_target_is():
    target = build_target("llama")
    draft, contract = build_draft(target, taps=(1, 2, 3))
    prompts = [torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(s)) for s in (6, 7)]
    want = compose.measure_tau(target, draft, [p[None] for p in prompts], TreeShape.chain(3), 8, contract=contract).tau
    with wrong_default():
        bounds = sample_target(target, prompts, new_tokens=4)
        tau = compose.measure_tau(
            target, draft, [p[None] for p in prompts], TreeShape.chain(3), 8, contract=contract
        ).tau
    assert _on_cpu(bounds.states, bounds.labels) and tau == want


def test_training_steps_run_on_the_device_it_is_given(tmp_path):
    from eaglewire.draft.vocab import VocabMap
    from eaglewire.train.dist import DistInfo
    from eaglewire.train.loop import TrainConfig, train

    target = build_target("llama")
    vmap = VocabMap.from_target_ids(torch.arange(0, VOCAB, 2), VOCAB)
    contract = target.contract((1, 2, 3), vocab_map=vmap)
    feats = OnlineFeatures(target, contract, pad_id=0)
    samples = tiny_samples(12)
    c = TrainConfig(max_steps=2, batch_size=4, warmup_steps=1, eval_every=2, ckpt_every=2, ttt_steps=2, dtype="fp32")
    with wrong_default():
        last = train(target, contract, vmap, feats, samples[:8], samples[8:], c, tmp_path, DistInfo(device="cpu"))
    assert last["step"] == 2 and all(a == a for a in last["acc"])  # real numbers, not meta placeholders


def test_an_eagle3_draft_follows_the_target_to_its_device():
    target = build_target("llama")
    draft, _ = build_draft(target, taps=(1, 2, 3))
    target.model.to("meta")  # a stand-in for a GPU: another device than the draft's
    compose.on_target_device(target, draft)
    assert draft.fc.weight.device.type == "meta"


# --- the command line hands --device to the loader ---------------------------------------------------------
class _Loaded(Exception):
    pass


COMMANDS = [
    ["generate", "-p", "hi"],
    ["bench"],
    ["serve"],
    ["eval"],
    ["train", "--data", "x", "-o", "{tmp}/t"],
    ["capture", "--text", "hi", "-o", "{tmp}/c.safetensors"],
    ["data", "regenerate", "--source", "mtbench", "-o", "{tmp}/r.jsonl.gz"],
    ["data", "capture", "--data", "x", "-o", "{tmp}/f"],
    ["doctor", "{tmp}", "--engine", "sglang", "--target", "{tmp}"],
    ["run", "-o", "{tmp}/run"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_each_command_says_its_device_first_and_loads_the_target_there(argv, tmp_path, monkeypatch):
    from eaglewire.cli.app import app
    from eaglewire.target import loader

    seen: list[str] = []

    def stub(spec, *, device="cpu", **kw):
        seen.append(device)
        raise _Loaded

    monkeypatch.setattr(loader, "load_target", stub)
    monkeypatch.setattr(compose, "_said", set())
    args = [a.format(tmp=tmp_path) for a in argv]
    result = CliRunner().invoke(app, [*args, "--device", "cpu"])
    assert isinstance(result.exception, _Loaded), result.output
    assert seen == ["cpu"]
    assert result.output.lstrip().startswith("device: cpu")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refused = CliRunner().invoke(app, [*args, "--device", "cuda"])
    assert refused.exit_code == 2 and "torch sees 0 GPU" in refused.output and seen == ["cpu"]


def test_a_block_drafts_attached_target_tensors_follow_its_modules():
    """A DFlash draft reads the target's embedding and head as plain attributes, which Module.to leaves behind:
    its proposer takes them to the device its modules are on (a target spread over GPUs keeps its head on the
    last one)."""
    target = build_target("llama")
    draft, contract = build_dflash(target, taps=(1, 2, 3))
    draft.to("meta")
    assert draft.embed_weight.device.type == "cpu"
    compose.family_of(contract).proposer(draft, contract, TreeShape.chain(3), 64, None)
    assert draft.embed_weight.device.type == draft.head_weight.device.type == "meta"
