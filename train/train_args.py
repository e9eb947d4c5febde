"""``drafterkit train``'s arguments (and ``python -m drafterkit.train``'s), importable without torch: ``drafterkit train
--help`` and its usage errors answer before anything heavy loads (the verb itself runs in :mod:`train.run`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", default=[], metavar="key.sub=value",
                        help="recipe overrides, e.g. optim.lr=1e-3 train.max_steps=20 output_dir=runs/x")
    parser.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
