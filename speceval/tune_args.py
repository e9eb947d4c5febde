"""``drafterkit tune``'s flags and search defaults, importable without torch: ``drafterkit tune --help`` and its
usage errors answer before anything heavy loads (the verb itself runs in :mod:`speceval.tune`)."""

from __future__ import annotations

import argparse

from drafterkit.speceval.eval_args import EvalConfig, csv_values, thread_count, tree_spec

#: the search ``drafterkit tune --thorough`` runs (``speceval.tune.tune``'s defaults too): chain lengths, static
#: trees, EAGLE-2 dynamic trees and confidence thresholds tried (30 candidates for a drafter with thresholds), at
#: batch size 1 and at ``THOROUGH_CONCURRENCY``: ~14 minutes on a 2-core CPU for an EAGLE-3 head on SmolLM2-135M
DEFAULT_KS = (2, 3, 4, 5, 6)
DEFAULT_TREES = ("3,2,1,1,1", "2,2,1,1")
DEFAULT_DYNAMIC = ("dynamic:12:4:3", "dynamic:24:5:4", "dynamic:40:6:6")
DEFAULT_THRESHOLDS = (0.0, 0.05, 0.15)
THOROUGH_CONCURRENCY = 4
#: the search ``drafterkit tune`` runs without ``--thorough``: chains of 2, 3 and 5, the incumbent tree, one dynamic
#: tree, thresholds 0 and 0.1 (10 candidates), at batch size 1 only: ~66 decoding runs of 48 tokens where the
#: thorough search makes ~224 (a third of them at batch size 4), a few minutes on a 2-core CPU
QUICK_KS = (2, 3, 5)
QUICK_TREES = ("3,2,1,1,1",)
QUICK_DYNAMIC = ("dynamic:24:5:4",)
QUICK_THRESHOLDS = (0.0, 0.1)
QUICK_CONCURRENCY = 1
#: the shape tune keeps for a drafter (a checkpoint, ``PATH+ngram``, ...) unless a challenger is faster beyond the
#: noise: the quickstart's fixed tree
DEFAULT_INCUMBENT = "3,2,1,1,1@0.1"
#: the incumbent for a model-free proposer (``ngram``, ``rest``, ``suffix``): a chain of ``drafterkit eval``'s
#: default K, the shape eval measures it in without a tuned setting and vLLM serves its ``ngram`` and ``suffix``
#: methods in (``num_speculative_tokens`` in a chain); a trained head's tree is no proposer's default there
FREE_INCUMBENT = f"chain:{EvalConfig.k}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="drafter folder, training checkpoint or run folder (PATH+ngram: prompt lookup "
                                      "in front of it; PATH+rest: lookup and retrieval; PATH+suffix: suffix decoding; "
                                      "each recorded under its own key, tuned+ngram / tuned+rest / tuned+suffix, "
                                      "beside the drafter's own; ngram / suffix: a model-free proposer, recorded "
                                      "per target, dtype and corpus under $DRAFTERKIT_HOME/tuned)")
    p.add_argument("--datastore", default=None,
                   help="the corpus PATH+rest retrieves from (suffix's and PATH+suffix's corpus suffix tree): "
                        "sharegpt or a ShareGPT / chat JSON(L) file (default: sharegpt, as drafterkit eval)")
    p.add_argument("--target", default=None,
                   help="target model (name or folder; default: the target the checkpoint's recipe.yaml records, "
                        "else smollm2-135m)")
    p.add_argument("--dtype", default=None,
                   help="fp32 | bf16 | fp16 | auto (default: the dtype the drafter's decoding.json records, as "
                        "drafterkit eval uses it, else auto: bf16 where the device has bf16 units, as drafterkit eval "
                        "and quickstart pick, else fp32)")
    p.add_argument("--device", default="auto",
                   help="auto | cpu | cuda | cuda:N (auto: cuda where available, as drafterkit eval)")
    p.add_argument("--no-exact", action="store_true",
                   help="measure the fast path instead of the decoder's exact mode (decode.exact_mode, on by default "
                        "here as in drafterkit eval, so the shape chosen is the fastest under the cost eval measures: "
                        "~5-10%% of tokens/s for chains, ~11-20%% for trees by CPU, SmolLM2-135M bf16, "
                        "docs/benchmarks/exactness.md); use it when the tuned shape will be evaluated with "
                        "drafterkit eval --no-exact")
    p.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--benchmark", default="sharegpt",
                   help="tuning prompts: sharegpt (the held-out split, past the prompts eval and training's own "
                        "evaluation use) or a .jsonl file; never mt-bench / humaneval, which judge the result")
    p.add_argument("--num-prompts", type=int, default=8, help="tuning prompts measured")
    p.add_argument("--max-new-tokens", type=int, default=48, help="new tokens per answer at most")
    p.add_argument("--concurrency", type=int, default=None,
                   help=f"the larger batch size tuned besides 1 (default: {QUICK_CONCURRENCY}, batch size 1 only; "
                        f"{THOROUGH_CONCURRENCY} with --thorough)")
    p.add_argument("--thorough", action="store_true",
                   help="the full search (~14 minutes on a 2-core CPU for an EAGLE-3 head on SmolLM2-135M): chains of "
                        f"{','.join(map(str, DEFAULT_KS))}, trees {' and '.join(DEFAULT_TREES)}, dynamic trees "
                        f"{','.join(DEFAULT_DYNAMIC)}, thresholds {','.join(map(str, DEFAULT_THRESHOLDS))}, "
                        f"batch sizes 1 and {THOROUGH_CONCURRENCY}; without it a short one (a few minutes): chains of "
                        f"{','.join(map(str, QUICK_KS))}, {QUICK_TREES[0]}, {QUICK_DYNAMIC[0]}, thresholds "
                        f"{','.join(map(str, QUICK_THRESHOLDS))}, batch size 1. --k, --tree, --dynamic, "
                        "--draft-threshold and --concurrency given replace their part of either")
    p.add_argument("--k", type=csv_values(int, "--k"), default=None,
                   help=f"chain lengths tried (default: {','.join(map(str, QUICK_KS))}; --thorough: "
                        f"{','.join(map(str, DEFAULT_KS))}; up to what the drafter "
                        "drafts a round: Medusa's num_heads, DFlash's block_size - 1; a larger one given is refused)")
    p.add_argument("--tree", action="append", dest="trees", metavar="TREE", type=tree_spec,
                   help=f"a static tree tried (branching factors such as 3,2,1); repeatable "
                        f"(default: {' and '.join(QUICK_TREES)}; --thorough: {' and '.join(DEFAULT_TREES)})")
    p.add_argument("--dynamic", type=csv_values(str, "--dynamic"), default=None,
                   help=f"EAGLE-2 dynamic trees tried (dynamic:TOTAL:DEPTH:TOPK, comma-separated; default: "
                        f"{','.join(QUICK_DYNAMIC)}; --thorough: {','.join(DEFAULT_DYNAMIC)}); "
                        "trees, --tree ones too, are tried only for drafters that draw "
                        "them: one given for a chain-only drafter (dflash, dspark) is refused")
    p.add_argument("--draft-threshold", type=csv_values(float, "--draft-threshold"), default=None,
                   dest="thresholds",
                   help=f"confidence thresholds tried (default: {','.join(map(str, QUICK_THRESHOLDS))}; --thorough: "
                        f"{','.join(map(str, DEFAULT_THRESHOLDS))}; ngram and "
                        "suffix have none: one given for them is refused)")
    p.add_argument("--incumbent", default=None,
                   help="the shape kept unless a candidate is faster on the same prompts beyond the noise (its paired "
                        "tokens/s ratio's ~95%% lower bound above 1): TREE@THRESHOLD, chain:K@THRESHOLD, or none (the "
                        "fastest candidate wins outright); without @THRESHOLD the threshold is 0 (default: "
                        f"{DEFAULT_INCUMBENT} for a drafter, not used for a chain-only one, where a tree given is "
                        f"refused; {FREE_INCUMBENT} for the model-free ngram, rest and suffix)")
    p.add_argument("--eta", type=int, default=3, help="successive halving keeps the best 1/eta per rung")
    p.add_argument("--first", type=int, default=2, help="batches in the first rung (doubled each rung)")
    p.add_argument("--seed", type=int, default=0,
                   help="decoding seed (batch j uses seed + j; greedy tuning does not sample)")
    p.add_argument("--no-write", action="store_true", help="measure and print only; leave decoding.json as it is")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (weights loading included)")
