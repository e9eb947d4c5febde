"""The ``drafterkit train`` verb and ``python -m train`` / ``accelerate launch -m train``.

    drafterkit train recipes/smoke.yaml output_dir=runs/smoke optim.lr=1e-3
    accelerate launch --config_file recipes/accelerate/single_gpu.yaml -m train recipes/draft_lm.yaml
    torchrun --nproc_per_node 2 -m train recipes/draft_lm.yaml train.cpu=true   # multi-process CPU

Positional ``key.sub=value`` overrides are applied to the YAML before validation (values parsed
with ``yaml.safe_load``). ``--print-recipe`` validates and prints the resolved recipe without training.
"""

from __future__ import annotations

import argparse
import json
import sys

from train.recipe import RecipeError, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="recipe overrides, e.g. optim.lr=1e-3 train.max_steps=20 output_dir=runs/x")
    parser.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")


def run(args: argparse.Namespace) -> int:
    """Validate the recipe, train, print a one-line JSON summary. Returns 0, or 2 on a bad recipe."""
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except (RecipeError, FileNotFoundError) as exc:
        print(f"drafterkit train: {exc}", file=sys.stderr)
        return 2
    if args.print_recipe:
        print(recipe.to_yaml())
        return 0
    from train.loop import train

    result = train(recipe)
    print(json.dumps({"output_dir": result.output_dir, "global_step": result.global_step,
                      "stopped": result.stopped, "final_loss": result.losses[-1] if result.losses else None,
                      "best_score": result.best_score}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
