"""Prompt lookup in repetition loops: tau of the ``ngram`` proposer (``drafters.ngram.lookup``: the longest matching
n-gram, its EARLIEST occurrence, as vLLM's ``ngram`` method) against the rule it replaced (the MOST RECENT
occurrence), greedy chains of K on the default target.

In a loop of period p < K the most recent occurrence of the row's last n-gram ends p tokens before the row does,
so it can propose at most p tokens a round; the earliest has the whole loop after it. ``--benchmark`` prompts
(default: the built-in loop prompts; or mt-bench, humaneval, sharegpt, a .jsonl file) show whether the rule
matters off the loops too. Counts only (tau, draft tokens, accepted), deterministic: no timing.

    python benchmarks/lookup_loops.py                                  # the loop prompts, K=5, 128 new tokens
    python benchmarks/lookup_loops.py --benchmark mt-bench --num-prompts 16
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from drafterkit import decode
from drafterkit.assets.target import load_target
from drafterkit.decode.protocol import Proposal
from drafterkit.drafters.ngram import NGramConfig, NGramDrafter
from drafterkit.speceval.prompts import select_prompts

LOOPS = ["Write the word hello 40 times, separated by spaces.",
         'Repeat the sentence "I will not talk in class." ten times.',
         "Count from 1 to 60, one number per line.",
         "Print the letter a 50 times."]


def most_recent(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The replaced rule: up to ``k`` tokens after the MOST RECENT earlier occurrence of the longest match."""
    n = len(tokens)
    for g in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        pattern = tokens[n - g:]
        for j in range(n - g - 1, -1, -1):
            if tokens[j: j + g] == pattern:
                return tokens[j + g: j + g + k]
    return []


class MostRecent(NGramDrafter):
    """``NGramDrafter`` with the replaced rule, for the comparison only."""

    def propose(self, state, k, sampling, generator):
        conts = [most_recent(t, k, self.config.max_ngram, self.config.min_ngram) if a and k else []
                 for t, a in zip(state.tokens, state.active)]
        rows = [c + [0] * (k - len(c)) for c in conts]
        return Proposal(tokens=torch.tensor(rows, dtype=torch.long).reshape(len(rows), k), probs=None,
                        lengths=torch.tensor([len(c) for c in conts], dtype=torch.long))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmark", default=None, help="mt-bench | humaneval | sharegpt | a .jsonl file (default: "
                                                     "the built-in repetition-loop prompts)")
    p.add_argument("--num-prompts", type=int, default=len(LOOPS))
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-ngram", type=int, default=NGramConfig.max_ngram)
    p.add_argument("--min-ngram", type=int, default=NGramConfig.min_ngram)
    args = p.parse_args()
    torch.set_num_threads(1)
    target, tok = load_target("smollm2-135m")
    bench = args.benchmark
    if bench is None:
        bench = str(Path(tempfile.mkdtemp()) / "loops.jsonl")
        Path(bench).write_text("".join(json.dumps({"prompt": t}) + "\n" for t in LOOPS))
    prompts = select_prompts(bench, tok, args.num_prompts).prompts
    config = NGramConfig(max_ngram=args.max_ngram, min_ngram=args.min_ngram)
    totals = {}
    for name, drafter in (("earliest (vLLM)", NGramDrafter(config)), ("most recent", MostRecent(config))):
        committed = passes = drafted = accepted = 0
        for pr in prompts:
            s = decode.generate(target, [pr.input_ids], drafter=drafter, max_new_tokens=args.max_new_tokens,
                                num_draft_tokens=args.k).stats
            print(f"{name:16s} {pr.id:12s} tau {s.tau:.2f}  drafted {s.drafted:4d}  accepted {s.accepted:4d}")
            committed += s.committed - 1  # the prefill's token is not a verification pass's
            passes, drafted, accepted = passes + s.target_forwards, drafted + s.drafted, accepted + s.accepted
        totals[name] = (committed / max(passes, 1), drafted, accepted)
    for name, (tau, drafted, accepted) in totals.items():
        print(f"{name:16s} all prompts: tau {tau:.2f}  drafted {drafted}  accepted {accepted}")


if __name__ == "__main__":
    main()
