"""The core runtime (torch's GEMMs, no acceleration layer) equals HF transformers' forward on every
supported architecture, tree masks included; the runtime a surface picks is said once, and without the
fastcpu extra every surface decodes the same tokens on the plain runtime."""

import logging

import pytest
import torch
from proposers import OracleProposer
from tiny import VOCAB, build_draft, build_target

from eaglewire import fastcpu
from eaglewire.capture.hooks import capture
from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.decoding.hf_runtime import HFRuntime
from eaglewire.decoding.runtime import StaticRuntime, plain_runtime
from eaglewire.decoding.tree import TreeShape
from eaglewire.serve import runtimes


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_prefill_decode_and_taps_match_hf(arch):
    target = build_target(arch)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target.model(input_ids=ids).logits  # [1, 12, V]
    rt = StaticRuntime(target, max_len=32)
    pos = torch.arange(12)[None]
    logits, taps = rt.forward(ids[:, :9], pos[:, :9], 0, taps=(0, 2, 4))
    torch.testing.assert_close(logits, ref[:, :9], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(taps, capture(target, (0, 2, 4), ids[:, :9]).taps, atol=1e-4, rtol=1e-4)
    for t in range(9, 12):  # single-token decode steps on the cache
        step, _ = rt.forward(ids[:, t:t + 1], pos[:, t:t + 1], t)
        torch.testing.assert_close(step[:, 0], ref[:, t], atol=1e-4, rtol=1e-4)


def test_plain_runtime_falls_back_to_transformers_for_other_architectures():
    assert isinstance(plain_runtime(build_target("llama"), 16), StaticRuntime)
    assert isinstance(plain_runtime(build_target("deepseek_v3"), 16), HFRuntime)


def test_without_the_extra_a_surface_decodes_on_the_plain_runtime_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(fastcpu, "available", lambda: "the fastcpu extra is not installed (test)")
    monkeypatch.setattr(runtimes, "_said", set())
    target = build_target("llama")
    said: list[str] = []
    rt = runtimes.make_runtime(target, 64, calibrate=True, log=said.append)
    runtimes.make_runtime(target, 64, calibrate=True, log=said.append)
    assert type(rt) is StaticRuntime
    assert said == ["runtime: plain static-cache runtime (the fastcpu extra is not installed (test); the same "
                    "tokens, slower)"]
    draft, contract = build_draft(target, taps=(1, 2, 3))
    prop = runtimes.make_proposer(draft, contract, TreeShape.chain(3), 64, rt)
    assert prop.lean is None  # the draft's own modules
    prompt = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    ref = greedy_reference(rt, prompt, 16)
    out, _ = SpecDecoder(runtimes.make_runtime(target, 64), prop).generate(prompt, 16)
    assert out == ref
    out, _ = SpecDecoder(runtimes.make_runtime(target, 64), OracleProposer(ref, TreeShape.chain(3))).generate(prompt, 16)
    assert out == ref
    with caplog.at_level(logging.INFO, logger="eaglewire"):  # no log callback: said through logging, once
        monkeypatch.setattr(runtimes, "_said", set())
        runtimes.make_runtime(target, 64)
        runtimes.make_runtime(target, 64)
    assert sum("plain static-cache runtime" in r.getMessage() for r in caplog.records) == 1
