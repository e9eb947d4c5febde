"""The ``drafterkit`` command: ``train``, ``eval``, ``export``, ``assets``, ``quickstart``.

Each verb lives in the module that owns it; this file only wires argparse. Every verb module
exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (module, one-line help). Imported lazily so `drafterkit assets list` stays fast.
VERBS = {
    "train": ("train.run", "train a drafter from a YAML recipe (same as `accelerate launch -m train`)"),
    "eval": ("decode.bench", "measure a drafter: tau, acceptance, tokens/s vs plain decoding and transformers"),
    "export": ("drafters.export", "export a trained drafter for vLLM / SGLang / transformers"),
    "assets": ("decode.assets_cli", "fetch / list the pinned target, data and eval prompts"),
    "quickstart": ("train.quickstart", "fetch, train and evaluate a drafter for the default target"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drafterkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (module, help_) in VERBS.items():
        p = sub.add_parser(verb, help=help_, description=help_)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            p.set_defaults(_missing=module)
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"drafterkit {args.verb}: not available in this build ({args._missing} missing)", file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
