"""``drafterkit quickstart``'s flags and the defaults they show, importable without torch: ``drafterkit quickstart
--help`` and its usage errors answer before anything heavy loads (the verb itself runs in
:mod:`drafterkit.quickstart.run`)."""

from __future__ import annotations

import argparse

from drafterkit.speceval.eval_args import EvalConfig, thread_count
from drafterkit.train.options import KINDS as TRAINED_KINDS

#: Draft shapes the quickstart measures: a static tree (the 3 best first tokens, 2 after each, then one per
#: depth to depth 5, so prompt lookup's chains keep K = 5 tokens behind it: 3 + 6 + 6 + 6 + 6 nodes before
#: the threshold prunes them). It beat the chain of 5 in every side-by-side run
#: (docs/benchmarks/trees-and-thresholds.md); add ``--tree chain`` to measure the chain too.
DEFAULT_TREES = ("3,2,1,1,1",)
#: the confidence threshold the quickstart measures when neither ``--draft-threshold`` nor a tuned setting says
DEFAULT_THRESHOLD = "0.1"
#: ``drafterkit eval``'s defaults, which the quickstart's eval flags share unless it sets its own (draft threshold,
#: tree, dtype)
EVAL_DEFAULTS = EvalConfig()
#: the reference rows the quickstart measures: the engine's plain decoding and transformers ``generate`` (the
#: factors of its headline). Not ``hf-assisted``: transformers' assisted generation takes a draft LM drafting
#: chains without a cutoff, and the quickstart's rows draft trees with one
QUICK_BASELINES = ("engine", "hf")
#: new tokens per answer of the fp32 exactness check (at most ``--max-new-tokens``)
EXACTNESS_TOKENS = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=14.5,
                   help="training budget in minutes (train.max_minutes); tune, eval and the exactness check add "
                        "~7 min on a 2-core CPU with bf16 units, ~19 in fp32")
    p.add_argument("--output-dir", default="drafterkit-quickstart", help="report folder (training under train/)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="the output folder holds an earlier quickstart's training: continue it until it has "
                            "trained --minutes in all (train.resume=auto; a larger --minutes trains a finished run "
                            "longer) instead of refusing to start")
    again.add_argument("--no-train", action="store_true",
                       help="the output folder holds an earlier quickstart's training: measure its last checkpoint "
                            "again (tune, eval, exactness check and a new report, under that run's recipe) without "
                            "training")
    again.add_argument("--overwrite", action="store_true",
                       help="the output folder holds an earlier quickstart's training: delete its checkpoints, "
                            "logs and evals and train from step 0 (train.overwrite=true) instead of refusing to "
                            "start")
    kinds = " | ".join(sorted(TRAINED_KINDS, key=lambda k: k != "eagle3"))  # training's table: no torch
    p.add_argument("--kind", default=None, help=f"drafter kind: {kinds} (default: eagle3 if recipes/eagle3.yaml "
                                                "exists, else draft_lm)")
    p.add_argument("--recipe", default=None, help="recipe YAML (default: recipes/<kind>.yaml)")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="extra recipe override, repeatable (e.g. --set data.num_examples=200)")
    p.add_argument("--num-prompts", type=int, default=EVAL_DEFAULTS.num_prompts, help="eval prompts per benchmark")
    p.add_argument("--max-new-tokens", type=int, default=EVAL_DEFAULTS.max_new_tokens,
                   help=f"new tokens per answer (default {EVAL_DEFAULTS.max_new_tokens}; speedups grow with the answer "
                        "length on this target, see docs/benchmarks/lookup-and-retrieval.md)")
    p.add_argument("--baselines", default=",".join(QUICK_BASELINES),
                   help="comma-separated, as in drafterkit eval (default: engine,hf; hf-assisted adds transformers' "
                        "assisted generation, which exists only for a draft LM measured as a chain without a "
                        "confidence cutoff: --kind draft_lm --tree chain --draft-threshold 0)")
    p.add_argument("--draft-threshold", default=None, dest="draft_thresholds",
                   help="comma-separated confidence thresholds measured side by side (0: a chain of K / the full "
                        "tree; >0: draft tokens whose path probability under the drafter falls below it are not "
                        f"proposed, EAGLE-2 style). Default: the tuned setting's, else {DEFAULT_THRESHOLD}")
    p.add_argument("--tree", action="append", dest="trees", metavar="TREE",
                   help=f"draft shapes measured side by side, repeatable: chain (K tokens) or a static tree such as "
                        f"3,2,1 (branching factors per depth; see drafterkit eval --tree). Default: the tuned "
                        f"setting's, else {' and '.join(DEFAULT_TREES)}")
    p.add_argument("--no-tune", action="store_true",
                   help="skip the tune stage (drafterkit tune's search for the drafter's chain / tree / threshold on "
                        "held-out ShareGPT prompts, about 1.5 min with bf16 units, 3-6 in fp32, on a 2-core CPU) "
                        "and measure the fixed tree")
    p.add_argument("--no-hybrid", action="store_true",
                   help="do not also measure the drafter behind prompt lookup and retrieval (drafters.lookup.hybrid."
                        "LookupHybrid, eval spec PATH+rest: rows whose last 2+ tokens occurred before copy what "
                        "followed; the others add what followed their last n-gram in ShareGPT to the drafter's tree)")
    p.add_argument("--dtype", default="auto",
                   help="auto | bf16 | fp32 (or fp16), the evaluation's target and drafter (auto: bf16 where the "
                        "device has bf16 units, where a pass verifying 5 draft tokens costs ~1.1x a one-token step "
                        "in bf16 but 1.4-2x in fp32, see docs/benchmarks/; fp32 where bf16 would be emulated, "
                        "several times slower; "
                        "token-for-token exactness vs plain decoding is checked on the measured rows in fp32, and in "
                        "bf16 on a CPU in exact mode (see --no-exact), else in a short separate fp32 run, see "
                        "--exactness-prompts)")
    p.add_argument("--no-exact", action="store_true",
                   help="tune and measure the fast path instead of the decoder's exact mode (decode.exact_mode, on "
                        "by default here: the bf16 rows then decode plain decoding's text on a CPU and are checked "
                        "token for token; it costs ~5-10%% of tokens/s for chains, ~11-20%% for trees by CPU, "
                        "docs/benchmarks/exactness.md). Without it bf16 rows may diverge at near-ties: the report "
                        "counts them and the separate fp32 check (--exactness-prompts) runs")
    p.add_argument("--exactness-prompts", type=int, default=2,
                   help=f"prompts per benchmark of the fp32 greedy check that the drafter's outputs equal plain "
                        f"decoding's token for token ({EXACTNESS_TOKENS} new tokens at most; 0 skips it; with --dtype "
                        "fp32 every measured row is checked instead)")
    p.add_argument("--device", default=EVAL_DEFAULTS.device,
                   help="auto | cpu | cuda | cuda:N: where the target and the drafter train and are measured "
                        f"(auto: cuda where available) (default: {EVAL_DEFAULTS.device})")
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads for training and evaluation (default: torch's; 1 on a busy machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (training, evaluation, model loading)")
