// A bf16 GEMM for a few rows (decode.few_rows): y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= 16, in two builds of one
// loop: AVX-512 BF16 (operator drafterkit::few_rows_linear) and AVX2 with FMA (drafterkit::few_rows_linear_avx2).
//
// The weight is packed once (decode/few_rows.py, `pack`) into blocks of 16 output columns, each block [K/2][16][2]:
// for every pair of input positions, the 16 columns' two weights side by side, the layout VDPBF16PS multiplies
// against one broadcast pair of an input row. Each weight is read from memory once per call whatever M is, and each
// 64-byte load feeds every row's arithmetic, so at M <= 16 the call costs about what reading the weights costs. Each
// tile prefetches the next one's weights, so the loads overlap the arithmetic.
// Accumulation is fp32 in k order; the result is rounded to bf16 (nearest even). The AVX2 build widens each weight
// to fp32 (its 16 bits shifted into the high half) and multiplies with FMAs; it has 16 vector registers, not 32, so
// it takes the rows in groups of at most 6 per pass over a block, the later groups reading the block's weights
// again from cache. The kernel functions carry their own target attributes: the library loads on any x86-64 CPU,
// and decode/few_rows.py calls only the operator the CPU runs.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <optional>
#include <vector>
#include <cstring>
#include <ATen/Parallel.h>
#include <immintrin.h>

#define DK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define DK_AVX2 __attribute__((target("avx2,fma")))

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


// --- AVX2 + FMA --------------------------------------------------------------------------------------------------

constexpr int kGroup = 6;  // rows per pass over a block: 2 x 6 accumulators and 4 widened weights fill the 16 registers

// The rows in near-equal groups of at most kGroup (8 -> 4 + 4, 11 -> 5 + 6, 16 -> 5 + 5 + 6): how many groups, and
// the size of the one starting at `row` with `left` groups to go. The inputs' layout and the tiles both follow it.
inline int group_count(int m) { return (m + kGroup - 1) / kGroup; }
inline int group_rows(int m, int row, int left) { return (m - row) / left; }

// fp32 -> bf16, nearest even; a NaN stays a (quiet) NaN. 8 values -> 8 x 16 bits in the low 128 bits.
DK_AVX2 inline __m128i to_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)), nan);
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(r, 16), _mm256_srli_epi32(r, 16));
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// H groups of 8 output columns (2: one block; 4: two blocks, for one row) by R rows. xf holds the rows' inputs as
// fp32, each value repeated 8 times, [K/2][R][2][8]: the FMAs take them as memory operands, so no register holds a
// broadcast input. `next` (or null) is the weight the following tile reads, prefetched into L2 meanwhile.
template <int R, int H>
DK_AVX2 inline void tile2(const float* xf, int64_t kp_count, const uint16_t* wp, int64_t block_stride,
                          const char* next, const uint16_t* bias, uint16_t* y, int64_t n, int64_t col0) {
  __m256 acc[R][H];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    if (next != nullptr)
      for (int h = 0; h < H; h += 2) _mm_prefetch(next + (kp * H / 2 + h / 2) * 64, _MM_HINT_T1);
    __m256 even[H], odd[H];
    for (int h = 0; h < H; ++h) {
      const __m256i raw = _mm256_loadu_si256(
          (const __m256i*)(wp + (h / 2) * block_stride + kp * 2 * kCols + (h % 2) * kCols));
      even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      odd[h] = _mm256_castsi256_ps(_mm256_and_si256(raw, high));
    }
    const float* xr = xf + kp * R * 16;
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h)
        acc[r][h] = _mm256_fmadd_ps(odd[h], _mm256_load_ps(xr + 16 * r + 8),
                                    _mm256_fmadd_ps(even[h], _mm256_load_ps(xr + 16 * r), acc[r][h]));
  }
  for (int h = 0; h < H; ++h) {
    const int64_t c0 = col0 + h * 8, left = n - c0;
    if (left <= 0) break;
    __m256 add = _mm256_setzero_ps();
    alignas(32) uint16_t tail[8] = {0};
    if (bias != nullptr) {
      const uint16_t* src = bias + c0;
      if (left < 8) src = static_cast<const uint16_t*>(memcpy(tail, src, left * 2));
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)src));
      add = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
    for (int r = 0; r < R; ++r) {
      const __m128i out = to_bf16(_mm256_add_ps(acc[r][h], add));
      if (left >= 8) {
        _mm_storeu_si128((__m128i*)(y + r * n + c0), out);
      } else {
        _mm_store_si128((__m128i*)tail, out);
        memcpy(y + r * n + c0, tail, left * 2);
      }
    }
  }
}

using Tile2 = void (*)(const float*, int64_t, const uint16_t*, int64_t, const char*, const uint16_t*, uint16_t*,
                       int64_t, int64_t);
constexpr Tile2 kTile2[kGroup] = {tile2<1, 2>, tile2<2, 2>, tile2<3, 2>, tile2<4, 2>, tile2<5, 2>, tile2<6, 2>};

// Blocks [first, last) for all M rows: one row two blocks a tile; more rows one block a tile, the rows in groups of
// near-equal size (at most kGroup) whose inputs xf holds one after another.
DK_AVX2 void blocks_avx2(const float* xf, int m, int64_t kp_count, const uint16_t* wp, const uint16_t* bias,
                         uint16_t* y, int64_t n, int64_t first, int64_t last) {
  const int64_t stride = kp_count * 2 * kCols;
  int64_t blk = first;
  if (m == 1) {
    for (; blk + 2 <= last; blk += 2) {
      const char* next = reinterpret_cast<const char*>(wp + (blk + 2) * stride);
      tile2<1, 4>(xf, kp_count, wp + blk * stride, stride, next, bias, y, n, blk * kCols);
    }
  }
  const int groups = group_count(m);
  for (; blk < last; ++blk) {
    const char* next = reinterpret_cast<const char*>(wp + (blk + 1) * stride);
    for (int g = 0, row = 0; g < groups; ++g) {
      const int rows = group_rows(m, row, groups - g);
      kTile2[rows - 1](xf + row * kp_count * 16, kp_count, wp + blk * stride, stride, g == 0 ? next : nullptr, bias,
                       y + row * n, n, blk * kCols);
      row += rows;
    }
  }
}

}  // namespace

// x [..., K] bf16 (M = the product of the leading sizes, 1..16; K even); packed [ceil(N/16), K/2, 32] bf16; bias [N]
static at::Tensor run(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias, int64_t n,
                      bool avx2) {
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
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const auto* bp = has_bias ? reinterpret_cast<const uint16_t*>(b.data_ptr<at::BFloat16>()) : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  if (!avx2) {
    const auto* xp = reinterpret_cast<const uint32_t*>(rows.data_ptr<at::BFloat16>());
    Blocks blocks_m = kByRows[m - 1];
    at::parallel_for(0, (nblk + 1) / 2, 8, [&](int64_t begin, int64_t end) {
      blocks_m(xp, kp_count, wp, bp, yp, n, begin * 2, std::min(end * 2, nblk));
    });
    return y;
  }
  // the inputs widened to fp32 once, each value 8 times, each group of rows laid out [K/2][rows][2][8] as blocks_avx2
  // reads them (32-byte aligned: at::empty's buffers are 64-byte aligned)
  const auto* xb = reinterpret_cast<const uint16_t*>(rows.data_ptr<at::BFloat16>());
  at::Tensor wide = at::empty({m * k * 8}, x.options().dtype(at::kFloat));
  float* xf = wide.data_ptr<float>();
  const int groups = group_count(int(m));
  for (int g = 0, row = 0; g < groups; ++g) {
    const int count = group_rows(int(m), row, groups - g);
    float* dst = xf + row * k * 8;
    for (int64_t kp = 0; kp < kp_count; ++kp)
      for (int r = 0; r < count; ++r)
        for (int j = 0; j < 2; ++j) {
          const uint32_t bits = uint32_t(xb[(row + r) * k + 2 * kp + j]) << 16;
          float value;
          memcpy(&value, &bits, 4);
          float* out = dst + ((kp * count + r) * 2 + j) * 8;
          for (int i = 0; i < 8; ++i) out[i] = value;
        }
    row += count;
  }
  at::parallel_for(0, (nblk + 1) / 2, 8, [&](int64_t begin, int64_t end) {
    blocks_avx2(xf, int(m), kp_count, wp, bp, yp, n, begin * 2, std::min(end * 2, nblk));
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias, int64_t n) {
  return run(x, packed, bias, n, false);
}

at::Tensor linear_avx2(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t n) {
  return run(x, packed, bias, n, true);
}

TORCH_LIBRARY(drafterkit, lib) {
  lib.def("few_rows_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
  lib.def("few_rows_linear_avx2(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(drafterkit, CPU, lib) {
  lib.impl("few_rows_linear", &linear);
  lib.impl("few_rows_linear_avx2", &linear_avx2);
}
