"""``drafterkit export``'s arguments, importable without torch: ``drafterkit export --help`` and its usage
errors answer before anything heavy loads (the verb itself runs in :mod:`drafters.export.writers`, whose package
imports torch, so these live with the CLI)."""

from __future__ import annotations

import argparse

#: the export formats, as ``drafters.export.writers.FORMATS`` names them (its keys; ``tests/test_drafterkit_cli.py``
#: checks the two agree)
FORMATS = ("hf-assistant", "medusa", "sglang-eagle3", "vllm-dflash", "vllm-dspark", "vllm-eagle3", "vllm-peagle")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a drafter folder, a training checkpoint (OUTPUT_DIR/checkpoints/last) "
                                           "or a run OUTPUT_DIR (its best, else last, checkpoint)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="target layout")
    parser.add_argument("--output", default=None, help="folder to write (created); optional with --push-to-hub")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace what --output already holds (without it, a folder holding files is refused)")
    parser.add_argument("--target", default=None,
                        help="target name or folder (default: the one the drafter's training recipe records): "
                             "Medusa heads sharing its LM head write it from there; for hf-assistant, its "
                             "tokenizer is saved too")
    parser.add_argument("--dtype", default=None,
                        help="cast floating tensors (fp32 | bf16 | fp16 | auto; default: keep the checkpoint's)")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO", help="also upload to this Hub repo id")

