"""What ``drafterkit quickstart`` says before and while it runs (``drafterkit.quickstart.run``): the plan with its
time, memory and disk needs up front, and a one-line header per stage with what the stage does and its
share of the time, then the seconds it took.

    drafterkit quickstart: plan: fetch, datastore, train, tune, eval, exactness, report
      time: ... ; memory: ... ; disk: ...
    [quickstart 3/6] train: eagle3 from recipes/eagle3.yaml (the --minutes budget: 14.5 min, ...)
    [quickstart 3/6] train done in 871 s (88% of the 990 s so far)
"""

from __future__ import annotations

import contextlib
import time

from drafterkit.assets.device import resolve_device, resolve_dtype
from drafterkit.assets.records import plural
from drafterkit.decode.exact import exact_mode
from drafterkit.decode.fused import bitwise_exact
from drafterkit.train.feature_cache import recipe_cache_state
from drafterkit.train.prepare import feature_cache_pays
from drafterkit.train.recipe_data import load_data


def needs_lines(args, out) -> list[str]:
    """What the run needs, stated before it starts: memory, disk and time (the figures measured for the default
    EAGLE-3 run on a 2-core CPU, in fp32 and in bf16, docs/training.md "Features in the quickstart")."""
    store = "" if args.no_hybrid else ", the datastore (built once)"
    train = (f"no training (--no-train: {out}/train/checkpoints/last is measured again); " if args.no_train else
             f"{args.minutes:g} min of training (--minutes, data preparation included; no feature cache is built: "
             "training reads a complete one if present, else computes the target's features online), plus ")
    return [f"  time: {train}fetch (a no-op once cached){store}, {_tune_words(args)}"
            "and the evaluation, which is not time-bounded "
            f"({plural(args.num_prompts, 'prompt')} x up to {args.max_new_tokens} new tokens per row and benchmark)",
            "  memory: about 2.5 GB in fp32, 7 GB in bf16 (the peak resident memory of the whole default run on a "
            "2-core CPU" + (")" if args.no_hybrid else ", the ~0.3 GB ShareGPT datastore of the eval included)"),
            f"  disk: about 1.2 GB of pinned assets (0.77 GB) and datastores (~0.4 GB) in $DRAFTERKIT_HOME (once; "
            f"drafterkit assets list shows them), about 0.55 GB in {out} "
            "(last/ and one step checkpoint, ~260 MB each with optimizer state, and the report)"]


def _tune_words(args) -> str:
    """The tune stage's words in the plan line: its searches and their expected time (it does not shrink with
    ``--num-prompts``); empty with ``--no-tune``."""
    if args.no_tune:
        return ""
    searches = "one 15-candidate search" if args.no_hybrid else ("two 15-candidate searches, alone and behind "
                                                                 "lookup, and two 3-candidate ones, ngram and suffix")
    return (f"the tune stage ({searches}: ~1.5 min with bf16 units, ~3-6 min in fp32 on a quiet 2-core CPU, "
            "whatever the eval's size; --no-tune skips it), ")


class Stages:
    """The quickstart's stages, in order, each announced by :meth:`stage` and timed into ``timings``
    (``{stage: seconds}``, the report's stage table)."""

    def __init__(self, names: list[str], timings: dict[str, float]):
        self.names, self.timings, self.start = list(names), timings, time.perf_counter()

    def header(self, name: str, what: str, share: str) -> str:
        """``[quickstart N/M] NAME: WHAT (SHARE)``: the line printed when stage ``name`` starts."""
        return f"[quickstart {self.names.index(name) + 1}/{len(self.names)}] {name}: {what} ({share})"

    @contextlib.contextmanager
    def stage(self, name: str, what: str, share: str, *, record: bool = True):
        """Print the stage's header, run the block, print the seconds it took and its share of the run so far;
        ``record``: keep those seconds in ``timings`` under ``name``."""
        print("\n" + self.header(name, what, share), flush=True)
        t0 = time.perf_counter()
        yield
        now = time.perf_counter()
        secs, total = now - t0, now - self.start
        if record:
            self.timings[name] = secs
        print(f"[quickstart {self.names.index(name) + 1}/{len(self.names)}] {name} done in {secs:.0f} s "
              f"({100 * secs / max(total, 1e-9):.0f}% of the {total:.0f} s so far)", flush=True)


def feature_source(recipe, target, tok) -> str | None:
    """Where the quickstart's training reads the target's features from, so that no time is spent outside
    its ``--minutes`` budget: the recipe's offline cache when a complete one is present (``data.feature_cache``
    ``auto`` or a folder), else online, one target forward per step (see docs/training.md, "Features in the
    quickstart": on a 2-core CPU in fp32 a cache build costs more target time per example than the budget
    gives back; the rule is ``train.prepare.feature_cache_pays``, the one ``drafterkit train`` applies). Returns
    the ``data.feature_cache=off`` override to apply, or None (keep the recipe's setting); prints which it is and
    why.

    Raises:
        train.recipe.RecipeError: the drafter kind's feature layers do not fit the target.
    """
    if recipe.data.feature_cache == "off":
        return None
    spec, complete = recipe_cache_state(recipe, target, load_data(recipe, target, tok))
    if complete:
        print(f"features: the complete offline cache {spec.path} (no target forward while training)", flush=True)
        return None
    why = feature_cache_pays(recipe, len(spec.lengths), budget_counts_build=True)  # drafterkit train's rule
    print(f"features: online, one target forward per step. No complete feature cache for this data in "
          f"{spec.path.parent}, and none is built: {why} (a target pass over {len(spec.lengths):,} examples "
          f"({spec.tokens:,} tokens, {spec.tokens * spec.bytes_per_token / 1e9:.2f} GB) before the first step); "
          "`drafterkit features RECIPE` builds it outside the budget for later runs, which then read it", flush=True)
    return "data.feature_cache=off"


def rows_checked(args) -> bool:
    """Whether the eval's own rows are checked token for token against plain decoding (fp32 anywhere, bf16 /
    fp16 on a CPU in exact mode, which the eval runs unless ``--no-exact``: ``decode.fused.bitwise_exact``), so
    no separate fp32 exactness stage runs."""
    device = resolve_device(args.device)
    with exact_mode(not args.no_exact):  # the mode the eval will measure in; the one found is restored
        return bitwise_exact(resolve_dtype(args.dtype, device), device)
