"""Milliseconds per suffix-decoding proposal call (``drafters.lookup.suffix_tree.speculate``), for the corpus index
(ShareGPT's assistant turns as a suffix array, what ``--datastore sharegpt`` builds) and for a per-request
suffix tree (prompt + committed tokens), replaying a greedy-like decode: each round drafts after the context,
then commits the next few corpus tokens (the draft's accepted tokens plus the bonus token).

    python benchmarks/suffix_draft_cost.py [--rounds 200] [--profile]

Loads the cached datastore and suffix array (``drafterkit assets fetch`` and one ``drafterkit eval --datastore
sharegpt`` build them). Timings depend on the machine's load; ``--profile`` prints cProfile's top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from drafterkit.assets.target import load_target_tokenizer
from drafterkit.drafters.lookup.datastore import cached_datastore
from drafterkit.drafters.lookup.suffix_tree import SEPARATOR, SuffixTree, speculate
from drafterkit.drafters.suffix import SuffixConfig, corpus_index


def replay(corpus, rounds: int, k: int, seed: int = 0) -> tuple[list, list]:
    """``rounds`` (context, committed) pairs: contexts walk through random corpus documents, 1-4 tokens a round."""
    rng = np.random.default_rng(seed)
    toks = corpus.tokens[: corpus.size]
    seps = np.flatnonzero(toks == SEPARATOR)
    out = []
    while len(out) < rounds:
        d = int(rng.integers(len(seps) - 1))
        doc = toks[seps[d] + 1: seps[d + 1]].tolist()
        if len(doc) < 600:
            continue
        pos = 400
        while pos < len(doc) and len(out) < rounds:
            step = int(rng.integers(1, k + 1))
            out.append((doc[:pos], doc[pos: pos + step]))
            pos += step
    return out


def per_call_ms(fn, calls) -> float:
    t0 = time.perf_counter()
    for c in calls:
        fn(c)
    return 1e3 * (time.perf_counter() - t0) / max(len(calls), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--k", type=int, default=5, help="draft tokens per round (max_spec_tokens)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cfg = SuffixConfig()
    tok = load_target_tokenizer()
    corpus = corpus_index(cached_datastore("sharegpt", tok), cfg.max_tree_depth)
    calls = replay(corpus, args.rounds, args.k)
    knobs = (args.k, cfg.max_spec_factor, cfg.max_spec_offset, cfg.min_token_prob)

    def corpus_call(c):
        return speculate(corpus, c[0], *knobs)

    held = {"tree": SuffixTree(cfg.max_tree_depth), "n": 0}

    def tree_call(c):  # the per-request tree: the prompt once per document, then the committed tokens each round
        ctx, _ = c
        tree = held["tree"]
        if 0 not in tree or held["n"] > len(ctx) or tree.tokens_of(0)[:16] != ctx[:16]:  # a new document
            tree, held["n"] = SuffixTree(cfg.max_tree_depth), 0
            held["tree"] = tree
        tree.extend(0, ctx[held["n"]:])
        held["n"] = len(ctx)
        return speculate(tree, ctx, *knobs)

    drafted = [len(corpus_call(c).tokens) for c in calls[:50]]  # warm-up (page in the suffix array)
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    corpus_ms = per_call_ms(corpus_call, calls)
    tree_ms = per_call_ms(tree_call, calls)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    print(f"corpus: {corpus.size:,} tokens, {len(calls)} proposal calls, mean draft {np.mean(drafted):.2f} tokens")
    print(f"corpus index     {corpus_ms:8.3f} ms per proposal call")
    print(f"per-request tree {tree_ms:8.3f} ms per proposal call (incl. appending the committed tokens)")


if __name__ == "__main__":
    main()
