"""The ``drafterkit train`` verb and ``python -m drafterkit.train`` / ``accelerate launch -m drafterkit.train``.

    drafterkit train recipes/smoke.yaml output_dir=runs/smoke optim.lr=1e-3
    accelerate launch --config_file recipes/accelerate/single_gpu.yaml -m drafterkit.train recipes/draft_lm.yaml
    torchrun --nproc_per_node 2 -m drafterkit.train recipes/draft_lm.yaml train.cpu=true   # multi-process CPU

Positional ``key.sub=value`` overrides are applied to the YAML before validation (values parsed
with ``yaml.safe_load``). ``--print-recipe`` validates and prints the resolved recipe without training.
Options may come anywhere (``train R.yaml --print-recipe output_dir=x`` works).

Exit codes: 0 trained (or printed); 2 a user error (bad recipe, missing file, drafter options that do
not fit the target, a broken model folder the recipe names (``target.name_or_path``,
``drafter.options.checkpoint``), an output_dir holding another run), printed as one message, no traceback;
128 + signal number (130 SIGINT, 143 SIGTERM) when interrupted, after ``last/`` is saved.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys

from drafterkit.assets.console import Parser, datasets_quiet, deepspeed_quiet, user_warnings
from drafterkit.train.recipe import RecipeError, load_recipe
from drafterkit.train.train_args import add_arguments


def _say_once(message: str) -> None:
    """Print a user error on stderr from the first process only: every process of a launch validates the
    same recipe and target, so the other ranks would print the same line (``RANK`` unset: one process)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, file=sys.stderr)


def _target_load_error() -> type[Exception]:
    """``assets.target.TargetLoadError``, imported when an exception reaches :func:`run`'s handler for it (an
    ``except`` clause's class is evaluated only then): that module imports torch, which a refused recipe never
    needs."""
    return importlib.import_module("drafterkit.assets.target").TargetLoadError


def run(args: argparse.Namespace) -> int:
    """Validate the recipe, train, print a one-line JSON summary (last line of stdout).

    The recipe is validated before torch, transformers or the training loop are imported (this module and
    ``train.recipe`` load none of them), so a bad recipe is refused at once, even on a loaded machine.

    Returns 0; 2 on a user error (see the module docstring); 128 + signal number when interrupted.
    """
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.print_recipe:
            print(recipe.to_yaml())
            return 0
        # only a valid recipe loads the training loop (torch, transformers; accelerate and datasets when it runs)
        train = importlib.import_module("drafterkit.train.loop").train
        with datasets_quiet():  # its bars are a line per refresh in a log; training's own bar stays
            result = train(recipe)
    except (RecipeError, FileNotFoundError) as exc:
        _say_once(f"drafterkit train: error: {exc}")
        return 2
    except KeyboardInterrupt:
        print("drafterkit train: aborted; checkpoints hold the last complete save (resume with "
              "train.resume=auto)", file=sys.stderr)
        return 128 + signal.SIGINT
    except _target_load_error() as exc:  # a broken target folder, or a Hub id that cannot be reached
        _say_once(f"drafterkit train: error: target.name_or_path: {exc}")
        return 2
    if int(os.environ.get("RANK", "0")) == 0:  # one summary line for a multi-process run
        print(json.dumps({"output_dir": result.output_dir, "global_step": result.global_step,
                          "stopped": result.stopped, "final_loss": result.losses[-1] if result.losses else None,
                          "best_score": result.best_score, "drafter": result.drafter,
                          "peak_memory_mb": result.peak_memory_mb,
                          "train_peak_memory_mb": result.train_peak_memory_mb}))
    if result.stopped == "interrupted":
        return 128 + (result.signal or signal.SIGINT)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m drafterkit.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    with user_warnings(), deepspeed_quiet():  # as drafterkit VERB prints them: torchrun starts this in each process
        return run(parser.parse_intermixed_args(argv))
