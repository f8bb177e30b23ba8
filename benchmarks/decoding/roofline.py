"""How fast a verify forward could be on this machine: the roofline floor of a k-row step of a target.

Why: the verify-cost targets (4 / 8 / 16 rows at most 1.10 / 1.25 / 1.5x one decode step) are ratios, and
whether a ratio is reachable depends on the machine: a k-row step has to read every weight once (memory)
and do 2 FLOP per weight per row (compute), so it cannot be faster than the larger of bytes / bandwidth
and FLOPs / peak. Divided by the measured 1-row step, that floor is the best ratio any kernel could reach
here; a target below it cannot be met on this host, whatever the code does. Both rates are measured on
this machine, by the ops the runtime itself uses (a sum streaming a buffer far larger than the caches;
oneDNN's prepacked linear on the target's widest GEMM shape), between the benchmark's own timed steps,
never taken from a data sheet.

    python -m benchmarks.decoding.bench_verify   # reports the floor beside the measured medians
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from eaglewire.fastcpu.gemm import PACKED, Gemm, candidate_layouts
from eaglewire.decoding.layers import head_dim
from eaglewire.hw import last_level_cache_bytes

STREAM_MIN_BYTES = 512 << 20  # the streamed buffer: at least this, and 8x the last-level cache
PEAK_ROWS = 256  # rows of the compute-bound GEMM timed for the peak (enough to leave memory-bound territory)


@dataclass(frozen=True)
class StepCost:
    """What one forward of `rows` new tokens over `cached` tokens must move and compute."""

    weight_bytes: int  # every layer matrix and the head, read once
    cache_bytes: int  # K and V of every layer, cached + new tokens
    flops: int  # 2 per weight per row, plus attention's QK^T and PV

    def floor_s(self, bandwidth: float, peak: float) -> float:
        """The roofline time: the larger of (bytes / bandwidth) and (flops / peak), in seconds."""
        return max((self.weight_bytes + self.cache_bytes) / bandwidth, self.flops / peak)


def step_cost(target, rows: int, cached: int) -> StepCost:
    """The cost of a `rows`-token step of a wrapped HF target (verifier.loader.Target) after `cached`
    tokens: weight counts from its real matrices (embedding rows read are negligible; a tied head counts
    once, as the head), attention from its config. For a dense target: an MoE's count would include every
    expert, which no single row reads, so it would not be a floor (the static-cache runtimes run dense targets only)."""
    cfg = target.text_config
    head = target.model.get_output_embeddings().weight
    matrices = [p for p in target.layers.parameters() if p.dim() == 2] + [head]
    weights = sum(p.numel() for p in matrices)
    size = head.element_size()
    d, layers = head_dim(cfg), len(target.layers)
    ctx = cached + rows
    kv = 2 * layers * int(cfg.num_key_value_heads) * d * ctx  # K and V elements read (and the new ones written)
    attention = 4 * rows * ctx * int(cfg.num_attention_heads) * d * layers  # QK^T and PV, 2 FLOP per MAC
    return StepCost(weight_bytes=weights * size, cache_bytes=kv * size, flops=2 * rows * weights + attention)


class RateProbe:
    """This machine's two rates, sampled between the timed steps of a benchmark (the machine's speed
    drifts by tens of percent between minutes here, so rates measured once, before or after, do not
    describe the steps they are compared with): the bytes per second a sum reads from a buffer 8x the
    last-level cache (at least STREAM_MIN_BYTES: no sample finds it in a cache), and the FLOP per second
    of oneDNN's prepacked linear (the runtime's GEMM for several rows, gemm.Gemm's "dnnl" layout; its "tn"
    matmul where this torch build or dtype does not offer it) on a compute-bound [PEAK_ROWS, in] x [in, out] product of the target's own
    matrix shape. `bandwidth` and `peak` are the medians of the samples taken."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype = torch.float32) -> None:
        size = max(STREAM_MIN_BYTES, 8 * (last_level_cache_bytes() or 0))
        self.buf = torch.ones(size // torch.empty(0, dtype=dtype).element_size(), dtype=dtype)
        self.shape = (in_features, out_features)
        self.x = torch.randn(PEAK_ROWS, in_features, dtype=dtype)  # [R, in]
        packed = PACKED in candidate_layouts(dtype, compiled=False)
        self.lin = Gemm(
            torch.randn(out_features, in_features, dtype=dtype), None, (PACKED,) if packed else ()
        )  # [out, in]
        self.layout = PACKED if packed else "tn"
        self.flop = 2 * PEAK_ROWS * in_features * out_features
        self.buf.sum(), self.gemm()  # untimed: first calls pay for page faults and oneDNN's kernel choice
        self.read_s: list[float] = []
        self.gemm_s: list[float] = []

    def gemm(self) -> torch.Tensor:  # [R, out]
        return self.lin(self.x, self.layout)

    def sample(self) -> None:
        """Time one pass over the buffer and one GEMM."""
        for fn, out in ((self.buf.sum, self.read_s), (self.gemm, self.gemm_s)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)

    @property
    def bandwidth(self) -> float:
        return self.buf.numel() * self.buf.element_size() / statistics.median(self.read_s)

    @property
    def peak(self) -> float:
        return self.flop / statistics.median(self.gemm_s)


def widest_matrix(target) -> tuple[int, int]:
    """(in, out) of the target's layer matrix with the most weights: the GEMM shape RateProbe times."""
    w = max((p for p in target.layers.parameters() if p.dim() == 2), key=lambda p: p.numel())
    return int(w.shape[1]), int(w.shape[0])
