// A few-row fp32 GEMM (y = x W^T + b, x [M, K] with M small) over a weight packed in column panels.
// Built and loaded at run time by panel_gemm.py (its docstring: why, and the benchmark), once per kernel there
// (panel_gemm.KERNELS): the ISA flags, the panel width NR, the rows per register block MR and the op's
// namespace come from the build's -D flags, so that one source is the AVX2 kernel (NR 8, MR 8: one ymm a
// panel row, 8 of the 16 registers accumulating) and the AVX-512 one (NR 16, MR 16: one zmm a panel row,
// 16 of the 32 registers accumulating), and both can be loaded in one process.
//
// Layout: panels [P, K, NR], P = ceil(N / NR); panel p holds output columns p*NR .. p*NR+NR-1, one NR-wide
// row per k (zero-padded past N). A block of up to MR rows keeps its MR x NR outputs in registers (MR
// vector accumulators), and each k loads the panel's NR weights once and broadcasts one x value per row:
// the weight streams from memory once per block, at MR FMAs per NR weights. Why MR = 8 in one block rather than
// two blocks of 4: the second block would re-read the panel from cache with the memory idle, after the
// first streamed it with the FMA units half idle; one block of 8 overlaps the two (benchmarks/decoding/bench_gemm.py
// times 8 rows). M > MR rows run as ceil(M / MR) balanced blocks (12 = 6 + 6). Each panel is read in one
// sequential stream, prefetched PREFETCH floats ahead (the hardware prefetcher alone leaves the stream
// short of the memory's pace). Panels are split between the threads of
// torch's own OpenMP pool (at::parallel_for; built with -fopenmp, or it runs on one thread).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#if !defined(EAGLEWIRE_PANEL_NR) || !defined(EAGLEWIRE_PANEL_MR) || !defined(EAGLEWIRE_PANEL_NS)
#error "built by panel_gemm.py, whose Kernel.flags() define EAGLEWIRE_PANEL_NR, _MR and _NS"
#endif

namespace {

constexpr int NR = EAGLEWIRE_PANEL_NR;  // output columns per panel: one vector (panel_gemm.Kernel.nr packs them)
constexpr int MR = EAGLEWIRE_PANEL_MR;  // rows per register block: MR accumulators + 1 weight + 1 broadcast
constexpr int PREFETCH = 512;  // floats ahead of the weight being read (2 KB)
static_assert(NR == 8 || NR == 16, "a panel row is one ymm (8 floats) or one zmm (16)");

typedef float vec __attribute__((vector_size(4 * EAGLEWIRE_PANEL_NR)));  // one panel row
inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }

// y[m, c] = sum_k x[m, k] * panel[k][c] (+ bias[c]) for M rows and the panel's NR columns (y's rows ldy apart)
template <int M>
void block(const float* __restrict__ x, int64_t K, const float* __restrict__ panel,
           const float* __restrict__ bias, float* __restrict__ y, int64_t ldy) {
  vec acc[M];
  const vec b = bias ? load(bias) : vec{};
  for (int m = 0; m < M; ++m) acc[m] = b;
  for (int64_t k = 0; k < K; ++k) {
    if ((k * NR) % 16 == 0) __builtin_prefetch(panel + k * NR + PREFETCH, 0, 0);  // one 64-byte line a time
    const vec w = load(panel + k * NR);
    for (int m = 0; m < M; ++m) acc[m] += w * x[m * K + k];  // one FMA (-mfma -ffp-contract=fast)
  }
  for (int m = 0; m < M; ++m) store(y + m * ldy, acc[m]);
}

// block<rows> for a run-time row count 1..MR
template <int M = MR>
void block_n(int rows, const float* x, int64_t K, const float* panel, const float* bias, float* y, int64_t ldy) {
  if constexpr (M >= 1) {
    if (rows == M) return block<M>(x, K, panel, bias, y, ldy);
    return block_n<M - 1>(rows, x, K, panel, bias, y, ldy);
  } else {
    TORCH_INTERNAL_ASSERT(false, "panel_linear: a block of ", rows, " rows (1..", MR, " expected)");
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                  int64_t out_features) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && panels.scalar_type() == at::kFloat,
              "panel_linear: expected fp32 x and panels, found ", x.scalar_type(), " and ", panels.scalar_type());
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == NR && panels.is_contiguous(),
              "panel_linear: expected contiguous panels [P, K, ", NR, "] (panel_gemm.pack), found ", panels.sizes());
  const int64_t P = panels.size(0), K = panels.size(1), N = out_features;
  TORCH_CHECK(K > 0, "panel_linear: expected a weight with at least one input feature, found ", K);
  TORCH_CHECK(x.size(-1) == K, "panel_linear: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(N > (P - 1) * NR && N <= P * NR, "panel_linear: ", P, " panels cannot hold ", N, " outputs");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous()),
              "panel_linear: expected a contiguous fp32 bias of ", N, " elements");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.numel() / K;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t blocks = (M + MR - 1) / MR;
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float tail[MR * NR];
    alignas(64) float tail_bias[NR];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c0 = p * NR, cols = std::min<int64_t>(NR, N - c0);
      const float* b = nullptr;
      if (bp && cols == NR) {
        b = bp + c0;
      } else if (bp) {  // the last panel's bias, zero-padded like its weights
        std::fill(tail_bias, tail_bias + NR, 0.f);
        std::copy(bp + c0, bp + c0 + cols, tail_bias);
        b = tail_bias;
      }
      for (int64_t i = 0, m0 = 0; i < blocks; ++i) {
        const int rows = static_cast<int>((M - m0) / (blocks - i));  // balanced: 12 rows = 6 + 6
        if (cols == NR) {  // straight into y
          block_n(rows, xp + m0 * K, K, pp + p * K * NR, b, yp + m0 * N + c0, N);
        } else {  // the last panel, partly past N: through a buffer
          block_n(rows, xp + m0 * K, K, pp + p * K * NR, b, tail, NR);
          for (int r = 0; r < rows; ++r) std::copy(tail + r * NR, tail + r * NR + cols, yp + (m0 + r) * N + c0);
        }
        m0 += rows;
      }
    }
  });
  return y;
}

}  // namespace

// through a macro of our own, so that the namespace macro expands before TORCH_LIBRARY pastes it
#define EAGLEWIRE_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define EAGLEWIRE_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

EAGLEWIRE_LIBRARY(EAGLEWIRE_PANEL_NS, m) {
  m.def("linear(Tensor x, Tensor panels, Tensor? bias, int out_features) -> Tensor");
}

EAGLEWIRE_LIBRARY_IMPL(EAGLEWIRE_PANEL_NS, CPU, m) {
  m.impl("linear", linear);
}
