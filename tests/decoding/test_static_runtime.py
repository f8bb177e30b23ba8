"""The core runtime (torch's GEMMs, no acceleration layer) equals HF transformers' forward on every
supported architecture, tree masks included; the runtime a surface picks is said once, and without the
fastcpu extra every surface decodes the same tokens on the plain runtime."""

import logging

import pytest
import torch
from proposers import OracleProposer
from tiny import VOCAB, assert_matches_hf, build_draft, build_target

from eaglewire import fastcpu
from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.decoding.hf_runtime import HFRuntime
from eaglewire.decoding.runtime import StaticRuntime, plain_runtime
from eaglewire.decoding.tree import TreeShape
from eaglewire import compose


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_prefill_decode_and_taps_match_hf(arch):
    target = build_target(arch)
    assert_matches_hf(target, StaticRuntime(target, max_len=32))


def test_plain_runtime_falls_back_to_transformers_for_other_architectures():
    assert isinstance(plain_runtime(build_target("llama"), 16), StaticRuntime)
    assert isinstance(plain_runtime(build_target("deepseek_v3"), 16), HFRuntime)


def test_without_the_extra_a_surface_decodes_on_the_plain_runtime_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(fastcpu, "available", lambda: "the fastcpu extra is not installed (test)")
    monkeypatch.setattr(compose, "_said", set())
    target = build_target("llama")
    said: list[str] = []
    rt = compose.runtime(target, 64, calibrate=True, log=said.append)
    compose.runtime(target, 64, calibrate=True, log=said.append)
    assert type(rt) is StaticRuntime
    assert said == [
        "runtime: plain static-cache runtime (the fastcpu extra is not installed (test); the same tokens, slower)"
    ]
    draft, contract = build_draft(target, taps=(1, 2, 3))
    prop = compose.proposer(draft, TreeShape.chain(3), 64, rt, contract=contract)
    assert prop.lean is None  # the draft's own modules
    prompt = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    ref = greedy_reference(rt, prompt, 16)
    out, _ = SpecDecoder(compose.runtime(target, 64), prop).generate(prompt, 16)
    assert out == ref
    out, _ = SpecDecoder(compose.runtime(target, 64), OracleProposer(ref, TreeShape.chain(3))).generate(prompt, 16)
    assert out == ref
    with caplog.at_level(logging.INFO, logger="eaglewire"):  # no log callback: said through logging, once
        monkeypatch.setattr(compose, "_said", set())
        compose.runtime(target, 64)
        compose.runtime(target, 64)
    assert sum("plain static-cache runtime" in r.getMessage() for r in caplog.records) == 1
