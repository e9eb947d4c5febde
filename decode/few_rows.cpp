// A bf16 GEMM for a few rows (decode.few_rows): y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= 16, on AVX-512 BF16.
//
// The weight is packed once (decode/few_rows.py, `pack`) into blocks of 16 output columns, each block [K/2][16][2]:
// for every pair of input positions, the 16 columns' two weights side by side, the layout VDPBF16PS multiplies
// against one broadcast pair of an input row. Each weight is read once per call whatever M is, and each 64-byte load
// feeds M dot-product instructions, so at M <= 16 the call costs about what reading the weights costs. Each tile
// prefetches the next one's weights, so the loads overlap the dot products.
// Accumulation is fp32 (pairs summed in the instruction, then added in k order); the result is rounded to bf16
// (nearest even). The kernel functions carry their own target attribute: the library loads on any x86-64 CPU, and
// decode/few_rows.py calls it only where the CPU has AVX-512 BF16.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <optional>
#include <vector>
#include <ATen/Parallel.h>
#include <immintrin.h>

#define DK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

constexpr int kCols = 16;  // output columns per packed block (one zmm of fp32 accumulators)

template <int M, int B>
DK_TARGET inline void tile(const uint32_t* x, int64_t kp_count, const uint16_t* wp, int64_t block_stride,
                           const uint16_t* bias, uint16_t* y, int64_t n, int64_t col0) {
  __m512 acc[M][B];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < B; ++b) acc[m][b] = _mm512_setzero_ps();
  // The next tile's B blocks follow this tile's in memory and hold B * 64 bytes per input pair, as this one does: each
  // iteration asks for that many of them into L2, so the next tile's weights stream in while this one's dot products
  // run (a verification pass's 6 rows otherwise pay the loads and the arithmetic one after the other). Past the last
  // tile the hint names bytes no one reads; a prefetch never faults.
  const char* next = reinterpret_cast<const char*>(wp + B * block_stride);
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    for (int b = 0; b < B; ++b) _mm_prefetch(next + (kp * B + b) * 64, _MM_HINT_T1);
    __m512bh w[B];
    for (int b = 0; b < B; ++b)
      w[b] = (__m512bh)_mm512_loadu_si512((const void*)(wp + b * block_stride + kp * 2 * kCols));
    for (int m = 0; m < M; ++m) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)x[m * kp_count + kp]);
      for (int b = 0; b < B; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], a, w[b]);
    }
  }
  for (int b = 0; b < B; ++b) {
    int64_t c0 = col0 + b * kCols;
    int64_t left = n - c0;
    __mmask16 keep = left >= kCols ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    __m512 add = _mm512_setzero_ps();
    if (bias != nullptr) {  // bf16 -> fp32: the 16 bits shifted into the high half
      __m256i raw = _mm256_maskz_loadu_epi16(keep, bias + c0);
      add = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    for (int m = 0; m < M; ++m) {
      __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[m][b], add));
      _mm256_mask_storeu_epi16((void*)(y + m * n + c0), keep, (__m256i)out);
    }
  }
}

// Up to 8 rows a tile is two blocks (2M accumulators, two weight loads per input pair); past 8, one block, so the M
// accumulators, the weights and the broadcast input still fit the 32 vector registers.
template <int M>
DK_TARGET void blocks(const uint32_t* x, int64_t kp_count, const uint16_t* wp, const uint16_t* bias, uint16_t* y,
                      int64_t n, int64_t first, int64_t last) {
  const int64_t stride = kp_count * 2 * kCols;  // one block's packed weights
  int64_t blk = first;
  if constexpr (M <= 8) {
    for (; blk + 2 <= last; blk += 2)
      tile<M, 2>(x, kp_count, wp + blk * stride, stride, bias, y, n, blk * kCols);
  }
  for (; blk < last; ++blk) tile<M, 1>(x, kp_count, wp + blk * stride, stride, bias, y, n, blk * kCols);
}

using Blocks = void (*)(const uint32_t*, int64_t, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t,
                        int64_t);
constexpr int kMaxRows = 16;
constexpr Blocks kByRows[kMaxRows] = {blocks<1>, blocks<2>, blocks<3>, blocks<4>, blocks<5>, blocks<6>,
                                      blocks<7>, blocks<8>, blocks<9>, blocks<10>, blocks<11>, blocks<12>,
                                      blocks<13>, blocks<14>, blocks<15>, blocks<16>};

}  // namespace

// x [..., K] bf16 (M = the product of the leading sizes, 1..16; K even); packed [ceil(N/16), K/2, 32] bf16; bias [N]
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias, int64_t n) {
  const int64_t k = x.size(-1), m = k ? x.numel() / k : 0;
  TORCH_CHECK(m >= 1 && m <= kMaxRows, "drafterkit::few_rows_linear takes 1 to ", kMaxRows, " rows, got ", m);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "drafterkit::few_rows_linear takes bf16 inputs and weights");
  TORCH_CHECK(k % 2 == 0 && packed.dim() == 3 && packed.size(1) * 2 == k && packed.size(2) == 2 * kCols &&
              packed.size(0) * kCols >= n, "drafterkit::few_rows_linear: the packed weight does not fit x or n");
  const at::Tensor rows = x.contiguous(), w = packed.contiguous();
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  TORCH_CHECK(!has_bias || (b.scalar_type() == at::kBFloat16 && b.numel() == n),
              "drafterkit::few_rows_linear: the bias must be bf16 [n]");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty(shape, x.options());
  const int64_t kp_count = k / 2, nblk = (n + kCols - 1) / kCols;
  const auto* xp = reinterpret_cast<const uint32_t*>(rows.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const auto* bp = has_bias ? reinterpret_cast<const uint16_t*>(b.data_ptr<at::BFloat16>()) : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  Blocks run = kByRows[m - 1];
  at::parallel_for(0, (nblk + 1) / 2, 8, [&](int64_t begin, int64_t end) {
    run(xp, kp_count, wp, bp, yp, n, begin * 2, std::min(end * 2, nblk));
  });
  return y;
}

TORCH_LIBRARY(drafterkit, lib) {
  lib.def("few_rows_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(drafterkit, CPU, lib) {
  lib.impl("few_rows_linear", &linear);
}
