"""Would AMX tiles make a verification pass of several rows cost one row's? A probe: the few-row kernel's packed
weights multiplied through AMX (TDPBF16PS) instead of AVX-512 BF16 dot products, timed against the kernel over whole
target passes, side by side in one process.

    python benchmarks/few_rows_amx.py --threads 2 --rows 1,2,6,8,11,16

drafterkit's few-row kernel (``decode/few_rows.cpp``) packs each weight into blocks of 16 output columns, each
``[K/2][16][2]``: 32 input positions of a block are one AMX B tile (16 rows of 64 bytes, contiguous). The probe below
multiplies ``x [M, K]`` (an A tile of M rows) by three such blocks at a time into three fp32 C tiles, then rounds to
bf16 as the kernel does. It is a probe, not the engine's path: no bias, ``K`` a multiple of 32, only where the CPU
has AMX (refused otherwise). Like ``few_rows_gemm --stream`` it runs every GEMM of one pass of the default target in
order, each layer with weights of its own (121 GEMMs, 269 MB that no cache holds), and prints milliseconds per pass
(best of ``--reps`` interleaved rounds of 5 passes) and the largest difference from the kernel's output (0 or one
bf16 rounding step: both sum fp32 products of bf16 pairs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = r"""
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <vector>
#define DK_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
namespace {
struct alignas(64) TileConfig { uint8_t palette; uint8_t start; uint8_t reserved[14]; uint16_t colsb[16];
                                uint8_t rows[16]; };
// tiles 0-2: C (three blocks of 16 columns, M rows of fp32); 3-5: B (16 input pairs x 16 columns); 6: A (M x 32)
DK_AMX void blocks(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, uint16_t* y, int64_t n, int64_t first,
                   int64_t last) {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 7; ++t) { cfg.rows[t] = (t >= 3 && t < 6) ? 16 : m; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  const int64_t stride = (k / 2) * 32;  // one block's packed weights, in bf16 units
  alignas(64) float c[16][16];
  for (int64_t blk = first; blk < last; blk += 3) {
    const int64_t nb = std::min<int64_t>(3, last - blk);
    _tile_zero(0); _tile_zero(1); _tile_zero(2);
    const uint16_t* wb = w + blk * stride;
    for (int64_t kc = 0; kc < k; kc += 32, wb += 16 * 32) {
      _tile_loadd(6, x + kc, k * 2);
      _tile_loadd(3, wb, 64); _tile_dpbf16ps(0, 6, 3);
      if (nb > 1) { _tile_loadd(4, wb + stride, 64); _tile_dpbf16ps(1, 6, 4); }
      if (nb > 2) { _tile_loadd(5, wb + 2 * stride, 64); _tile_dpbf16ps(2, 6, 5); }
    }
    for (int64_t b = 0; b < nb; ++b) {
      if (b == 0) _tile_stored(0, c, 64); else if (b == 1) _tile_stored(1, c, 64); else _tile_stored(2, c, 64);
      const int64_t c0 = (blk + b) * 16, left = n - c0;
      const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
      for (int64_t r = 0; r < m; ++r)
        _mm256_mask_storeu_epi16((void*)(y + r * n + c0), keep, (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c[r])));
    }
  }
  _tile_release();
}
}  // namespace
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  const int64_t k = x.size(-1), m = x.numel() / k;
  TORCH_CHECK(m >= 1 && m <= 16 && k % 32 == 0 && x.scalar_type() == at::kBFloat16, "probe: 1-16 bf16 rows, K % 32");
  const at::Tensor rows = x.contiguous(), w = packed.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty(shape, x.options());
  const int64_t nblk = (n + 15) / 16;
  const auto* xp = reinterpret_cast<const uint16_t*>(rows.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  at::parallel_for(0, (nblk + 2) / 3, 4, [&](int64_t begin, int64_t end) {
    blocks(xp, m, k, wp, yp, n, begin * 3, std::min(end * 3, nblk));
  });
  return y;
}
TORCH_LIBRARY(drafterkit_amx_probe, lib) { lib.def("linear(Tensor x, Tensor packed, int n) -> Tensor"); }
TORCH_LIBRARY_IMPL(drafterkit_amx_probe, CPU, lib) { lib.impl("linear", &linear); }
"""

from benchmarks.few_rows_gemm import SHAPES  # noqa: E402

#: the default target's GEMMs in one pass, in order, as ``few_rows_gemm --stream`` runs them: (out, in)
LAYERS = [(n, k) for name, n, k in SHAPES if name != "lm_head"] * 30 + [(n, k) for name, n, k in SHAPES
                                                                       if name == "lm_head"]


def ms_per_pass(fn, weights, rows: int, passes: int = 5) -> float:
    xs = {k: torch.randn(rows, k).bfloat16() for k in {k for _, k in LAYERS}}
    for packed, n, k in weights:  # one untimed pass
        fn(xs[k], packed, n)
    start = time.perf_counter()
    for _ in range(passes):
        for packed, n, k in weights:
            fn(xs[k], packed, n)
    return (time.perf_counter() - start) / passes * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,2,6,8,11,16")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    from drafterkit.decode import few_rows

    if not torch.cpu._is_amx_tile_supported():
        raise SystemExit("this CPU has no AMX tiles: the probe has nothing to measure")
    if not few_rows.available():
        raise SystemExit("the few-row kernel is not available here (it needs AVX-512 BF16 and a C++ compiler)")
    torch.cpu._init_amx()  # the process's permission to use the tile registers (Linux arch_prctl)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "few_rows_amx_probe.cpp"
        src.write_text(SOURCE)
        few_rows.build("drafterkit_few_rows_amx_probe", src)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weights = [(few_rows.pack((torch.randn(n, k, generator=g) * 0.02).bfloat16()), n, k) for n, k in LAYERS]
    kernel = lambda x, w, n: few_rows.linear(x, w, None, n)  # noqa: E731
    amx = torch.ops.drafterkit_amx_probe.linear
    print(f"{args.threads} threads, bf16, one pass: {len(LAYERS)} GEMMs, "
          f"{sum(w.numel() * 2 for w, _, _ in weights) / 1e6:.0f} MB; ms per pass, best of {args.reps}")
    print("| rows | kernel (AVX-512 BF16) | AMX probe | kernel / AMX | largest difference |")
    print("|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(rows, 576, generator=g).bfloat16()
        diff = (kernel(x, weights[2][0], 3072).float() - amx(x, weights[2][0], 3072).float()).abs().max().item()
        t_kernel, t_amx = [], []
        for _ in range(args.reps):
            t_kernel.append(ms_per_pass(kernel, weights, rows))
            t_amx.append(ms_per_pass(amx, weights, rows))
        a, b = min(t_kernel), min(t_amx)
        print(f"| {rows} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {diff:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
