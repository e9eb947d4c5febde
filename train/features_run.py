"""The ``drafterkit features`` verb (:mod:`train.features_args` holds its arguments).

    drafterkit features recipes/eagle3.yaml data.num_examples=200

The recipe is validated, and a drafter kind that reads no target features refused, before torch, transformers,
datasets or the cache builder are imported (this module and ``train.recipe`` load none of them), as
``drafterkit train`` does (:mod:`train.run`): a bad recipe is refused at once, even on a loaded machine. Only a
valid one loads :mod:`train.feature_cache`, which loads the target and the data and builds the cache.

Exit codes: 0 built (or already complete); 2 a user error (bad recipe or arguments, a kind without features, a
missing data file, too little disk), one message, no traceback; 130 when interrupted (rerun to resume).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from drafterkit.train.options import feature_kinds, kind_recipe
from drafterkit.train.recipe import RecipeError, load_recipe


def require_feature_kind(kind: str) -> None:
    """Raise ``train.recipe.RecipeError`` for a drafter kind that reads no target features."""
    if not kind_recipe(kind).reads_features:
        kinds = feature_kinds()
        raise RecipeError(f"drafter kind {kind!r} reads no target features (it needs the target's logits on "
                          f"every batch), so it has no feature cache; feature caches serve {kinds}")


def run(args: argparse.Namespace) -> int:
    """Validate the recipe and arguments, then build (or resume, verify, repair) its feature cache
    (:func:`train.feature_cache.build_for_recipe`, which prints a JSON summary as its last line).

    Returns 0; 2 on a user error (see the module docstring); 130 when interrupted.
    """
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.batch_size < 1 or args.shard_mb <= 0:
            raise RecipeError("--batch-size must be >= 1 and --shard-mb > 0")
        require_feature_kind(recipe.drafter.kind)  # before the target loads
    except (RecipeError, FileNotFoundError) as exc:
        print(f"drafterkit features: error: {exc}", file=sys.stderr)
        return 2
    # only a valid recipe loads the cache builder (torch, transformers; datasets when the data is read)
    build = importlib.import_module("drafterkit.train.feature_cache").build_for_recipe
    return build(recipe, args.batch_size, args.shard_mb)
