"""What bitwise exactness costs: the decoder's exact mode (``decode.exact_mode``) against the fast path, in bf16.

Exact mode (off in ``decode.generate`` by default, on in ``drafterkit eval`` / ``tune`` / ``quickstart``) is two
things: every query of a target pass attends through
``decode.attention.exact_sdpa`` (one-query SDPA over exactly its visible keys, where a verification pass ran
one masked SDPA over all its rows) and every linear layer's GEMM runs in calls of fixed row counts
(``decode.invariance``, ``decode.fused.ROW_INVARIANT``). This decodes ``--num-prompts`` prompts greedily,
interleaved prompt by prompt, plain and speculative (``--drafter``, a spec as ``drafterkit eval`` takes;
``ngram`` by default), each with exact mode on and off, and prints tokens/s, the ratio exact / inexact per
run, and how many speculative texts differ from plain decoding's in each mode (exact mode: 0); ``--batch``
adds plain decoding of all prompts as one ragged batch in each mode, against each prompt decoded alone.

    OMP_NUM_THREADS=1 python benchmarks/exactness_cost.py --drafter ngram --tree chain --num-prompts 4
    OMP_NUM_THREADS=1 python benchmarks/exactness_cost.py --drafter ngram --tree 3,2,1,1,1 --num-prompts 4
    python benchmarks/exactness_cost.py --drafter runs/qs/train/checkpoints/last+rest --tree 3,2,1,1,1
    OMP_NUM_THREADS=1 python benchmarks/exactness_cost.py --num-prompts 4 --batch   # + a ragged batch, plain
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--drafter", default="ngram", help="a drafter spec as drafterkit eval takes (e.g. CKPT+rest)")
    p.add_argument("--tree", default="chain", help="'chain' (a chain of --k), a static tree such as 3,2,1,1,1, "
                                                   "or dynamic[:TOTAL[:DEPTH[:TOPK]]]")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--draft-threshold", type=float, default=0.1)
    p.add_argument("--datastore", default="sharegpt")
    p.add_argument("--batch", action="store_true", help="also decode all prompts as one ragged batch, plain, "
                                                        "each mode, against each prompt decoded alone")
    a = p.parse_args()

    from drafterkit import decode
    from drafterkit.assets.target import load_target
    from drafterkit.speceval.eval_run import datastore_loader
    from drafterkit.speceval.methods import build_drafter
    from drafterkit.speceval.prompts import load_prompts

    target, tok = load_target(a.target, dtype=a.dtype)
    prompts = [q.input_ids for q in load_prompts(a.benchmark, tok, a.num_prompts)]
    drafter = build_drafter(a.drafter, target, datastore_loader(a.datastore, tok, quiet=False)).drafter
    if getattr(drafter, "supports_draft_threshold", False):
        drafter.draft_threshold = a.draft_threshold
    tree = None if a.tree == "chain" else a.tree
    runs = ["plain exact", "plain inexact", "spec exact", "spec inexact"]
    sums = {r: [0, 0.0] for r in runs}
    texts: dict[str, list[list[int]]] = {r: [] for r in runs}

    def _once(run: str, ids: list[int], max_new: int, into) -> None:
        with decode.exact_mode(run.endswith(" exact")):
            spec = run.startswith("spec")
            t0 = time.perf_counter()
            out = decode.generate(target, [ids], drafter=drafter if spec else None, tree=tree,
                                  num_draft_tokens=a.k, max_new_tokens=max_new).sequences[0]
            wall = time.perf_counter() - t0
        if into is not None:
            into[0][run][0] += len(out)
            into[0][run][1] += wall
            into[1][run].append(out)

    for warm in (True, False):  # one short untimed pass of every run first (weight copies, caches, allocator)
        for ids in prompts[:1] if warm else prompts:
            for run in runs:
                _once(run, ids, 4 if warm else a.max_new_tokens, None if warm else (sums, texts))
    print(f"{a.benchmark}, {len(prompts)} prompts x {a.max_new_tokens} new tokens, greedy, {a.dtype}, "
          f"{torch.get_num_threads()} threads, interleaved prompt by prompt; drafter {a.drafter}, tree {a.tree}")
    tps = {r: n / t for r, (n, t) in sums.items()}
    for r in runs:
        line = f"  {r:14s} tokens {sums[r][0]:5d}  tokens/s {tps[r]:7.2f}"
        if r.endswith(" exact"):
            line += f"  exact / inexact {tps[r] / tps[r.replace(' exact', ' inexact')]:.3f}"
        if r.startswith("spec"):
            mode = r.split()[1]
            differ = sum(s != q for s, q in zip(texts[r], texts[f"plain {mode}"]))
            line += (f"  x plain {tps[r] / tps['plain ' + mode]:.3f}  texts differing from plain: {differ} of "
                     f"{len(prompts)}")
        print(line)
    if a.batch:
        _ragged(target, prompts, a.max_new_tokens, texts)


def _ragged(target, prompts: list[list[int]], max_new: int, texts: dict) -> None:
    """Plain decoding of all prompts as one ragged batch, exact mode on and off (alternated, twice each): its
    tokens/s, and how many rows differ from the same prompt decoded alone in that mode (batch invariance)."""
    from drafterkit import decode
    from drafterkit.decode import invariance

    sums = {True: [0, 0.0], False: [0, 0.0]}
    differ = {}
    for _ in range(2):
        for exact in (True, False):
            with decode.exact_mode(exact):
                t0 = time.perf_counter()
                out = decode.generate(target, prompts, max_new_tokens=max_new).sequences
                sums[exact][1] += time.perf_counter() - t0
                sums[exact][0] += sum(len(o) for o in out)
            alone = texts["plain exact" if exact else "plain inexact"]
            differ[exact] = sum(o != q for o, q in zip(out, alone))
    tps = {k: n / t for k, (n, t) in sums.items()}
    print(f"ragged batch of {len(prompts)} prompts, plain decoding, twice each mode:")
    for exact in (True, False):
        line = f"  batch {'exact' if exact else 'inexact':8s} tokens/s {tps[exact]:7.2f}"
        if exact:
            line += f"  exact / inexact {tps[True] / tps[False]:.3f}"
        print(line + f"  rows differing from the prompt decoded alone: {differ[exact]} of {len(prompts)}")
    print("GEMM checks (decode.invariance):", invariance.checks())


if __name__ == "__main__":
    main()
