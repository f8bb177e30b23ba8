"""The roofline floor of a verify step (benchmarks/decoding/roofline.py): counts against a hand count, the floor's two
regimes, and the two measured rates on a small buffer."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.decoding import roofline  # the roofline model is a benchmark's (conftest: the root on sys.path)
from benchmarks.decoding.roofline import RateProbe, StepCost, step_cost, widest_matrix
from tiny import HIDDEN, LAYERS, VOCAB, build_target
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

INTER, HEADS, KV_HEADS = 128, 4, 2  # tiny.py's llama
HEAD_DIM = HIDDEN // HEADS


def test_step_cost_matches_a_hand_count_of_the_llama_shapes():
    target = build_target("llama")
    rows, cached = 3, 10
    per_layer = (
        HIDDEN * HIDDEN * 2  # q, o
        + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # k, v
        + 3 * HIDDEN * INTER
    )  # gate, up, down
    weights = LAYERS * per_layer + VOCAB * HIDDEN  # untied head: the embedding is only indexed
    ctx = cached + rows
    cost = step_cost(target, rows, cached)
    assert cost.weight_bytes == 4 * weights
    assert cost.cache_bytes == 4 * 2 * LAYERS * KV_HEADS * HEAD_DIM * ctx
    assert cost.flops == 2 * rows * weights + 4 * rows * ctx * HEADS * HEAD_DIM * LAYERS
    assert widest_matrix(target) in {(HIDDEN, INTER), (INTER, HIDDEN)}


def test_floor_is_memory_bound_for_one_row_and_compute_bound_for_many():
    target = build_target("llama")
    bandwidth, peak = 1e10, 1e10  # 1 FLOP per byte: one fp32 row does 0.5, 64 rows 32
    one, many = step_cost(target, 1, 8), step_cost(target, 64, 8)
    assert one.floor_s(bandwidth, peak) == pytest.approx((one.weight_bytes + one.cache_bytes) / bandwidth)
    assert many.floor_s(bandwidth, peak) == pytest.approx(many.flops / peak)
    assert StepCost(100, 0, 1).floor_s(10.0, 1.0) == pytest.approx(10.0)


def test_rate_probe_gives_finite_positive_medians_of_its_samples(monkeypatch):
    monkeypatch.setattr(roofline, "STREAM_MIN_BYTES", 8 << 20)
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: None)
    monkeypatch.setattr(roofline, "PEAK_ROWS", 32)
    probe = RateProbe(64, 128)
    assert probe.buf.numel() * 4 == 8 << 20 and probe.flop == 2 * 32 * 64 * 128
    for _ in range(3):
        probe.sample()
    assert len(probe.read_s) == len(probe.gemm_s) == 3
    # any real machine reads over 100 MB/s and computes over 100 MFLOP/s; a byte or FLOP count off by
    # 1e6 (a units slip) lands outside (1e8, 1e14)
    for rate in (probe.bandwidth, probe.peak):
        assert math.isfinite(rate) and 0 < rate < 1e14  # a sanity bound: a loaded machine measures low rates
    assert RateProbe(64, 128, torch.bfloat16).buf.numel() * 2 == 8 << 20
