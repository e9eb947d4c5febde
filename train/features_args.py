"""``drafterkit features``' arguments, importable without torch: ``drafterkit features --help`` and its usage
errors answer before anything heavy loads (the verb itself runs in :mod:`train.features_run`)."""

from __future__ import annotations

import argparse

SHARD_MB = 512  # default shard size: resume granularity, and the RAM one shard needs while it is built


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/): its target, data and drafter kind")
    parser.add_argument("overrides", nargs="*", default=[], metavar="key.sub=value",
                        help="recipe overrides, e.g. data.num_examples=200 data.feature_cache=/big/disk/features")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per target forward")
    parser.add_argument("--shard-mb", type=float, default=SHARD_MB,
                        help="shard size in MB (an interrupted build resumes at the first unfinished shard)")
