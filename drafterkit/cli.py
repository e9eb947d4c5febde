"""The ``drafterkit`` command: ``train``, ``features``, ``eval``, ``export``, ``serve-check``, ``assets``,
``quickstart``, ``tune``.

This file only wires argparse. Each verb names two things in :data:`VERBS`: the module of its arguments,
``add_arguments(parser)`` (argparse and torch-free constants only: ``drafterkit VERB --help`` and a usage
error answer in a fraction of a second), and ``module:function``, its ``run(args) -> int``, imported only
once the arguments parse (the verbs' own modules import torch and transformers, several seconds on a busy
CPU). A verb's options may come anywhere among its positionals (``drafterkit train R.yaml --print-recipe
output_dir=x``): argparse's subparsers stop at the first option, so what is left over is re-parsed by the
verb's own parser with ``parse_intermixed_args``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import NamedTuple

from drafterkit.assets.console import Parser, deepspeed_quiet, progress_for_logs, user_warnings


class Verb(NamedTuple):
    """A verb of ``drafterkit``: ``arguments``, the module whose ``add_arguments(parser)`` gives its flags (it
    imports no torch, transformers or model code); ``runner``, ``"module:function"`` that runs it; ``help``."""

    arguments: str
    runner: str
    help: str


VERBS = {
    "train": Verb("drafterkit.train.train_args", "drafterkit.train.run:run",
                  "train a drafter from a YAML recipe (same as `accelerate launch -m drafterkit.train`)"),
    "features": Verb("drafterkit.train.features_args", "drafterkit.train.features_run:run",
                     "build the target-feature cache a recipe trains a head from (once, resumable)"),
    "eval": Verb("drafterkit.speceval.eval_args", "drafterkit.speceval.eval_run:run",
                 "measure a drafter: tau, acceptance, tokens/s vs plain decoding and transformers"),
    "export": Verb("drafterkit.export_args", "drafterkit.drafters.export.writers:run",
                   "export a trained drafter for vLLM / SGLang / transformers"),
    "serve-check": Verb("drafterkit.serve_check_args", "drafterkit.speceval.serve_speed:run",
                        "run an export in vLLM and check it drafts and decodes as drafterkit does"),
    "assets": Verb("drafterkit.assets_verb", "drafterkit.assets_verb:run",
                   "fetch / list the pinned target, data and eval prompts"),
    "quickstart": Verb("drafterkit.quickstart.args", "drafterkit.quickstart.run:run",
                       "fetch, train and evaluate a drafter for the default target"),
    "tune": Verb("drafterkit.speceval.tune_args", "drafterkit.speceval.tune:run",
                 "choose a drafter's chain / tree / threshold by measured tokens/s; record it with the drafter"),
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` with each option's default: ``(default: X)`` appended to its help, lists as typed
    (``1,2,4``), unless the help already names a default or there is none to show (``None``, a flag's
    ``False``, an empty list). Options without help text show none (argparse prints no help line)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text, default = action.help or "", action.default
        if (not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
                or default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (list, tuple)) and not default) or "default" in text.lower()):
            return action.help
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; ``parser.verb_parsers`` maps each verb to its subparser (whose ``--help``
    shows the options' defaults: :class:`DefaultsHelpFormatter`).

    ``only``: give only that verb's subparser its arguments, importing its arguments module alone (``""``:
    no verb's, for ``drafterkit --help``). ``None``: every verb (the parser tests and tools inspect). No
    verb's runner is imported here (:func:`load_runner`)."""
    parser = Parser(prog="drafterkit", description="train speculative-decoding drafters for a "
                                     "frozen target LLM, measure them, tune and export them")
    parser.add_argument("--version", action="version", version=f"drafterkit {_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=Parser)
    parser.verb_parsers = {}
    for name, verb in VERBS.items():
        p = parser.verb_parsers[name] = sub.add_parser(name, help=verb.help, description=verb.help,
                                                       formatter_class=DefaultsHelpFormatter)
        if only is not None and name != only:
            continue
        importlib.import_module(verb.arguments).add_arguments(p)
    return parser


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``"unknown"`` for a tree not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("drafterkit")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def load_runner(verb: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs ``verb`` (:data:`VERBS`), its module imported now. Every verb's modules ship
    in the one package (``tests/test_layout.py`` imports them all), so a missing one is a broken install and
    raises ``ModuleNotFoundError``."""
    module, function = VERBS[verb].runner.split(":")
    return getattr(importlib.import_module(module), function)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args``, but a verb's options may follow its positionals (see module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if rest:  # e.g. `train R.yaml --print-recipe k=v`: the subparser stopped consuming positionals at the option
        verb_args = argv[argv.index(args.verb) + 1:]
        try:
            parsed = parser.verb_parsers[args.verb].parse_intermixed_args(verb_args)
        except TypeError:  # a verb whose arguments intermixed parsing cannot handle: the plain error
            parser.parse_args(argv)
            raise
        args = argparse.Namespace(**{**vars(args), **vars(parsed)})
    return args


def requested_verb(argv: list[str]) -> str:
    """The verb ``argv`` names (its first word that is a verb), or ``""`` when it names none (``--help``, a
    typo: the top-level parser answers those without importing any verb module)."""
    return next((a for a in argv if a in VERBS), "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = requested_verb(argv)
    progress_for_logs()
    try:
        args = parse(build_parser(only=verb), argv)
        run = load_runner(args.verb)  # imports torch and the verb's modules: seconds
        with user_warnings(), deepspeed_quiet():
            return int(run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C while the verb loads, or in one that keeps no handler (train, features do)
        print(f"\ndrafterkit{' ' + verb if verb else ''}: interrupted (Ctrl-C); what it had measured or written so "
              "far is not recorded: run it again", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
