"""One decoding step of the target (or one pass of ``--tokens`` tokens: a chain's verification pass), three ways,
interleaved in one process: transformers' forward, the compact forward (``decode/compact.py``) and the compiled
passes (``decode/compiled.py``), each through ``decode.cache.RaggedCache`` with the engine's merged and prepacked
linear layers, at a fixed context.

    python benchmarks/target_step.py --context 250 --steps 40 --reps 3

Prints milliseconds per step (each rep: a fresh cache, the prompt, 5 untimed steps, ``--steps`` timed ones) and
the ratios to transformers' forward; the compile (the first compiled step) is timed apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=250, help="prompt tokens before the timed steps")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=1, help="tokens per pass: 1 a decoding step, K + 1 a chain's "
                   "verification pass (each pass keeps its first token)")
    args = p.parse_args(argv)
    import torch

    from drafterkit import decode
    from drafterkit.assets.target import load_target
    from drafterkit.decode.cache import RaggedCache
    from drafterkit.decode.fused import fused_projections

    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target, dtype=args.dtype, device="cpu")
    prompt = [100 + i % 1000 for i in range(args.context)]
    ids = torch.full((1, args.tokens), 500)

    def steps(mode: str, n: int) -> float:
        cache = RaggedCache(target, 1, torch.device("cpu"), capacity=args.context + n + 16, compiled=mode == "compiled")
        cache.compact = mode != "transformers"
        with decode.compiled_mode(mode == "compiled"):
            cache.prefill([prompt], logits_to_keep=1)
            for _ in range(5):
                cache.run(ids, logits_to_keep=args.tokens)
                cache.keep(torch.tensor([1]))
            t0 = time.perf_counter()
            for _ in range(n):
                cache.run(ids, logits_to_keep=args.tokens)
                cache.keep(torch.tensor([1]))
            return (time.perf_counter() - t0) / max(n, 1) * 1e3

    modes = ("transformers", "compact", "compiled")
    with torch.inference_mode(), fused_projections(target):
        t0 = time.perf_counter()
        steps("compiled", 0)
        compile_s = time.perf_counter() - t0
        timed = {m: [steps(m, args.steps) for _ in range(1)] for m in modes}
        for _ in range(args.reps - 1):
            for m in modes:
                timed[m].append(steps(m, args.steps))
    base = sum(timed["transformers"]) / len(timed["transformers"])
    print(f"{args.target} {args.dtype}, {args.threads} threads, context {args.context}, {args.tokens} token(s) per "
          f"pass, {args.steps} steps x "
          f"{args.reps} reps; compile {compile_s:.0f} s")
    for m in modes:
        ms = sum(timed[m]) / len(timed[m])
        print(f"{m:>12}: {ms:6.1f} ms/step ({' '.join(f'{x:.1f}' for x in timed[m])}), {base / ms:.2f}x "
              "transformers' forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
