"""What one verification pass costs on this machine: a target forward over m new tokens (K = m - 1 draft
tokens plus the last committed one) through the decoder's own KV cache (``RaggedCache``), at ~200
tokens of context, relative to a one-token (plain decoding) step.

    python benchmarks/verify_cost.py --dtype fp32
    python benchmarks/verify_cost.py --dtype bf16 --context 200 --reps 8
    python benchmarks/verify_cost.py --dtype bf16 --compile --threads 2 --reps 20

Methods are interleaved rep by rep; each figure is the median. With ``output_hidden_states`` as the
feature-level drafters need it (``hidden=True``) and without. ``--compile``: the passes
compiled (``decode.compiled_mode``), every shape run once untimed first so its graph is built before
the timed reps. Speculative decoding can only pay when
tau exceeds (cost of a pass verifying K tokens + drafting) / (cost of a one-token step).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drafterkit.assets.target import load_target
from drafterkit.decode import compiled_mode
from drafterkit.decode.cache import RaggedCache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="fp32", help="fp32 | bf16")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--m", default="1,2,3,4,6", help="new tokens per forward (comma-separated)")
    p.add_argument("--compile", action="store_true", help="compiled passes (decode.compiled_mode)")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    with compiled_mode(a.compile):
        measure(a)


def measure(a: argparse.Namespace) -> None:
    """Time every (m, hidden) pass ``a.reps`` times, interleaved, and print the medians."""
    target, _ = load_target(a.target, dtype=a.dtype)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, 20000, (a.context,), generator=g).tolist()
    cache = RaggedCache(target, 1, next(target.parameters()).device, capacity=a.context + 64,
                        compiled=a.compile)
    ms = [int(x) for x in a.m.split(",")]
    times: dict[tuple[int, bool], list[float]] = {(m, h): [] for m in ms for h in (False, True)}
    with torch.no_grad():
        cache.prefill([ctx], logits_to_keep=1)
        for rep in range(a.reps + int(a.compile)):  # compiled: a first rep builds the graphs, untimed
            for m in ms:
                for h in (False, True):
                    ids = torch.randint(100, 20000, (1, m), generator=g)
                    t0 = time.perf_counter()
                    cache.run(ids, logits_to_keep=m, output_hidden_states=h)
                    if rep or not a.compile:
                        times[(m, h)].append(time.perf_counter() - t0)
                    cache.keep(torch.zeros(1, dtype=torch.long), valid_max=0)  # back to the context
    base = statistics.median(times[(1, False)])
    print(f"{a.target} {a.dtype}, {torch.get_num_threads()} threads, context {a.context}, median of {a.reps}"
          + (", compiled passes" if a.compile else ""))
    for (m, h), v in times.items():
        med = statistics.median(v)
        print(f"  m={m} (K={m - 1}) hidden={str(h):5s} {1000 * med:7.1f} ms  {med / base:5.2f}x a one-token step")


if __name__ == "__main__":
    main()
