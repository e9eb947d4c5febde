"""The default target's linear layers at 1-8 rows in bf16: ATen's GEMM as the engine's eager path calls it (oneDNN on
a prepacked weight where the CPU has that op, ATen's ``linear`` elsewhere) against drafterkit's few-row kernel
(``decode/few_rows.cpp``, each build the CPU runs: AVX-512 BF16, AVX2), one call each, hot caches, best of 5 timed
loops, microseconds.

    python benchmarks/few_rows_gemm.py --threads 2
    python benchmarks/few_rows_gemm.py --threads 2 --stream --against HEAD~1

Prints one line per layer shape and row count, and the sum over one decoder layer's four GEMMs (q/k/v and gate/up
merged, as the engine runs them) and the LM head. Needs a CPU the kernel runs on (``decode.few_rows.available``).

``--stream``: what a target pass sees instead: every GEMM of the default target's pass (30 decoder layers, each with
weights of its own, then the LM head: 269 MB of bf16) called in the pass's order, so the weights stream from memory,
milliseconds per pass (best of ``--reps`` rounds of 10 passes), ATen's and each kernel build's. ``--against REV``
adds the kernel of git revision ``REV`` (its ``decode/few_rows.cpp`` built under an operator namespace of its own),
timed in turn with the current one in the same process: a kernel change measured side by side ("-" where that kernel
does not take so many rows).

``--prefill``: one decoder layer's four GEMMs at prompt-sized row counts (``--rows``, e.g. 16,32,64,128,256),
milliseconds, best of ``--reps``: PyTorch's bf16 GEMM as the engine's eager path calls it, the kernel in calls of
16 rows, and one fp32 GEMM on the bf16 operands cast up (what ``decode.fused`` runs past ``KERNEL_MAX_ROWS`` rows
where oneDNN has no bf16 GEMM).
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
    p.add_argument("--stream", action="store_true", help="whole target passes, weights streaming from memory")
    p.add_argument("--against", default=None, help="with --stream: also the kernel of this git revision")
    p.add_argument("--reps", type=int, default=5, help="with --stream: timed rounds per kernel and row count")
    p.add_argument("--prefill", action="store_true", help="one layer's GEMMs at prompt-sized row counts, three ways")
    args = p.parse_args(argv)
    if args.against and not args.stream:
        p.error("--against compares whole passes: add --stream")
    import torch

    from drafterkit.decode import few_rows

    torch.set_num_threads(args.threads)
    if not few_rows.available():
        print("the few-row kernel does not run on this CPU (neither AVX-512 BF16 nor AVX2, or it did not build)")
        return 1
    rows = [int(r) for r in args.rows.split(",")]
    if args.stream:
        return stream(rows, args.against, args.reps)
    if args.prefill:
        return prefill(rows, args.reps)
    builds = few_rows.kernels()
    names = None
    sums = {m: [0.0] * (1 + len(builds)) for m in rows}
    with torch.inference_mode():
        for name, n, k in SHAPES:
            w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
            (aten, aten_name), packed = aten_gemm(w), few_rows.pack(w)
            if names is None:
                names = [aten_name, *builds]
                print(f"{args.threads} threads, bf16, microseconds per call ({' / '.join(names)})")
            loops = 30 if n > 10000 else 300
            cells = []
            for m in rows:
                x = torch.randn(m, k).to(torch.bfloat16)
                times = [best_us(lambda: aten(x), loops)]
                times += [best_us(lambda: op(x, packed, None, n), loops) for op in builds.values()]
                sums[m] = [a + t for a, t in zip(sums[m], times)]
                cells.append(f"{m} rows " + " / ".join(f"{t:.0f}" for t in times))
            print(f"{name} {n}x{k}: " + ", ".join(cells), flush=True)
    print("one layer + LM head: " + ", ".join(
        f"{m} rows " + " / ".join(f"{t:.0f}" for t in ts) + " (" + ", ".join(f"{ts[0] / t:.2f}x" for t in ts[1:]) + ")"
        for m, ts in sums.items()))
    return 0


def aten_gemm(w):
    """``(fn, name)``: ``fn(x)`` computes ``x @ w^T`` as the engine's eager path does (``decode.fused``): oneDNN on a
    weight prepacked once where this CPU has that op for bf16, ATen's ``linear`` elsewhere."""
    import torch

    from drafterkit.decode import fused

    onednn = fused._pack(w, None)
    if onednn is not None:
        return (lambda x: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], "")), "oneDNN prepacked"
    return (lambda x: torch.nn.functional.linear(x, w)), "ATen linear"


def kernel_at(rev: str):
    """The few-row operator built from ``decode/few_rows.cpp`` as git revision ``rev`` holds it, registered under
    ``drafterkit_<sha>`` (its own namespace, beside the current kernel's): its build for the widest instruction set
    this CPU runs. Raises SystemExit where that revision has no such build (before AVX2 had one)."""
    import subprocess
    import tempfile

    import torch

    from drafterkit.decode import few_rows

    from benchmarks.greedy_choice import revision_source

    root = Path(__file__).resolve().parents[1]
    sha = subprocess.run(["git", "rev-parse", "--short=10", rev], cwd=root, capture_output=True, text=True,
                         check=True).stdout.strip()
    src = revision_source(sha, "decode/few_rows.cpp")
    ns = f"drafterkit_{sha}"
    path = Path(tempfile.mkdtemp(prefix="few-rows-")) / f"{ns}.cpp"
    path.write_text(src.replace("TORCH_LIBRARY(drafterkit,", f"TORCH_LIBRARY({ns},")
                    .replace("TORCH_LIBRARY_IMPL(drafterkit,", f"TORCH_LIBRARY_IMPL({ns},"))
    few_rows.build(ns, path)
    op = "few_rows_linear" if "avx512_bf16" in few_rows.kernels() else "few_rows_linear_avx2"
    if not hasattr(getattr(torch.ops, ns), op):
        raise SystemExit(f"the kernel at {rev} has no build for this CPU ({op} is missing): compare a later revision")
    return getattr(getattr(torch.ops, ns), op)


def prefill(rows: list[int], reps: int) -> int:
    """``--prefill``: one decoder layer's GEMMs at many rows, three ways (module doc)."""
    import torch

    from drafterkit.decode import few_rows

    gen = torch.Generator().manual_seed(0)
    layer = [(n, k, (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)) for name, n, k in SHAPES
             if name != "lm_head"]
    weights = [(n, k, w, aten_gemm(w), few_rows.pack(w)) for n, k, w in layer]

    def kernel(x, packed, n):
        return [few_rows.linear(x[i: i + few_rows.ROWS], packed, None, n) for i in range(0, x.shape[0], few_rows.ROWS)]

    ways = {weights[0][3][1]: lambda x, n, w, aten, packed: aten(x),
            "kernel, 16-row calls": lambda x, n, w, aten, packed: kernel(x, packed, n),
            "fp32 GEMM, cast up": lambda x, n, w, aten, packed: torch.nn.functional.linear(x.float(), w.float())}
    print(f"{torch.get_num_threads()} threads, bf16 operands, one decoder layer's 4 GEMMs, ms, best of {reps}")
    print("| rows | " + " | ".join(ways) + " |")
    print("|---|" + "---|" * len(ways))
    with torch.inference_mode():
        for m in rows:
            xs = {k: torch.randn(m, k, generator=gen).to(torch.bfloat16) for _, k, *_ in weights}
            cells = []
            for way in ways.values():
                def one_layer():
                    for n, k, w, (aten, _), packed in weights:
                        way(xs[k], n, w, aten, packed)
                one_layer()
                best = float("inf")
                for _ in range(reps):
                    t0 = time.perf_counter()
                    one_layer()
                    best = min(best, (time.perf_counter() - t0) * 1e3)
                cells.append(f"{best:.1f}")
            print(f"| {m} | " + " | ".join(cells) + " |", flush=True)
    return 0


def stream(rows: list[int], against: str | None, reps: int) -> int:
    """``--stream``: milliseconds per whole pass of the default target's GEMMs, each kernel in turn (module doc)."""
    import torch

    from drafterkit.decode import few_rows

    layer = [s for s in SHAPES if s[0] != "lm_head"]
    pass_shapes = layer * 30 + [SHAPES[-1]]
    gen = torch.Generator().manual_seed(0)
    weights = []
    for _, n, k in pass_shapes:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        weights.append((n, k, aten_gemm(w), few_rows.pack(w)))
    print(f"{torch.get_num_threads()} threads, bf16, one pass: {len(weights)} GEMMs, "
          f"{sum(n * k for n, k, _, _ in weights) * 2 / 1e6:.0f} MB of weights; ms per pass, best of {reps}")
    kernels = {weights[0][2][1]: None, **{f"kernel ({isa})": op for isa, op in few_rows.kernels().items()}}
    if against:
        kernels[f"kernel at {against}"] = kernel_at(against)
    best = {(name, m): float("inf") for name in kernels for m in rows}
    with torch.inference_mode():
        inputs = {m: {k: torch.randn(m, k, generator=gen).to(torch.bfloat16) for _, k, _, _ in weights} for m in rows}
        for _ in range(reps):
            for m in rows:
                for name, op in kernels.items():  # in turn, so a slow spell of the machine hits each alike
                    if best[name, m] is None:  # that kernel refused this many rows in an earlier round
                        continue

                    def one_pass():
                        for n, k, (aten, _), packed in weights:
                            x = inputs[m][k]
                            if op is None:
                                aten(x)
                            else:
                                op(x, packed, None, n)
                    try:
                        one_pass()
                    except RuntimeError:  # a revision's kernel that takes fewer rows: "-" in its column
                        best[name, m] = None
                        continue
                    t0 = time.perf_counter()
                    for _ in range(10):
                        one_pass()
                    best[name, m] = min(best[name, m], (time.perf_counter() - t0) / 10 * 1e3)
    print("| rows | " + " | ".join(kernels) + " |")
    print("|---|" + "---|" * len(kernels))
    for m in rows:
        print(f"| {m} | " + " | ".join("-" if best[name, m] is None else f"{best[name, m]:.2f}" for name in kernels)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
