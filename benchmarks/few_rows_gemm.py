"""The default target's linear layers at 1-8 rows in bf16: oneDNN's prepacked GEMM (what the engine's eager path and
the compiled passes called before) against drafterkit's few-row kernel (``decode/few_rows.cpp``), one call each, hot
caches, best of 5 timed loops, microseconds.

    python benchmarks/few_rows_gemm.py --threads 2

Prints one line per layer shape and row count, and the sum over one decoder layer's four GEMMs (q/k/v and gate/up
merged, as the engine runs them) and the LM head. Needs a CPU with AVX-512 BF16 (``decode.few_rows.available``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: SmolLM2-135M's GEMMs: (name, out, in)
SHAPES = (("q/k/v merged", 960, 576), ("o_proj", 576, 576), ("gate/up merged", 3072, 576),
          ("down_proj", 576, 1536), ("lm_head", 49152, 576))


def best_us(fn, loops: int) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops * 1e6)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,2,4,6,8")
    args = p.parse_args(argv)
    import torch

    from drafterkit.decode import few_rows

    torch.set_num_threads(args.threads)
    if not few_rows.available():
        print("the few-row kernel does not run on this CPU (no AVX-512 BF16, or it did not build)")
        return 1
    rows = [int(r) for r in args.rows.split(",")]
    sums = {m: [0.0, 0.0] for m in rows}
    print(f"{args.threads} threads, bf16, microseconds per call (oneDNN prepacked / few-row kernel)")
    with torch.inference_mode():
        for name, n, k in SHAPES:
            w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
            onednn, packed = torch.ops.mkldnn._reorder_linear_weight(w, None), few_rows.pack(w)
            loops = 30 if n > 10000 else 300
            cells = []
            for m in rows:
                x = torch.randn(m, k).to(torch.bfloat16)
                a = best_us(lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""), loops)
                b = best_us(lambda: few_rows.linear(x, packed, None, n), loops)
                sums[m][0] += a
                sums[m][1] += b
                cells.append(f"{m} rows {a:.0f} / {b:.0f}")
            print(f"{name} {n}x{k}: " + ", ".join(cells), flush=True)
    print("one layer + LM head: " + ", ".join(f"{m} rows {a:.0f} / {b:.0f} ({a / b:.2f}x)"
                                              for m, (a, b) in sums.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
