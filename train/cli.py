"""The ``drafterkit`` command: ``train``, ``features``, ``eval``, ``export``, ``serve-check``, ``assets``,
``quickstart``, ``tune``.

Each verb lives in the module that owns it; this file only wires argparse. Every verb module
exposes ``add_arguments(parser)`` and ``run(args) -> int``. A verb's options may come anywhere
among its positionals (``drafterkit train R.yaml --print-recipe output_dir=x``): argparse's
subparsers stop at the first option, so what is left over is re-parsed by the verb's own parser
with ``parse_intermixed_args``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from pathlib import Path

# verb -> (module, one-line help). Imported lazily so `drafterkit assets list` stays fast.
VERBS = {
    "train": ("train.run", "train a drafter from a YAML recipe (same as `accelerate launch -m train`)"),
    "features": ("train.feature_cache", "build the target-feature cache a recipe trains a head from (once, resumable)"),
    "eval": ("speceval.bench", "measure a drafter: tau, acceptance, tokens/s vs plain decoding and transformers"),
    "export": ("drafters.export", "export a trained drafter for vLLM / SGLang / transformers"),
    "serve-check": ("speceval.serving", "run an export in vLLM and check it drafts and decodes as drafterkit does"),
    "assets": ("train.assets_cli", "fetch / list the pinned target, data and eval prompts"),
    "quickstart": ("train.quickstart", "fetch, train and evaluate a drafter for the default target"),
    "tune": ("speceval.tune", "choose a drafter's chain / tree / threshold by measured tokens/s; record it with the drafter"),
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

    ``only``: import the module of that verb alone and give only its subparser arguments (``""``: no
    verb's). A verb module imports torch and transformers, several seconds on a busy CPU, so
    :func:`main` imports just the verb it runs, and nothing for ``drafterkit --help``. ``None``: every
    verb (the parser tests and tools inspect)."""
    parser = argparse.ArgumentParser(prog="drafterkit", description="train speculative-decoding drafters for a "
                                     "frozen target LLM, measure them, tune and export them")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    parser.verb_parsers = {}
    for verb, (module, help_) in VERBS.items():
        p = parser.verb_parsers[verb] = sub.add_parser(verb, help=help_, description=help_,
                                                       formatter_class=DefaultsHelpFormatter)
        if only is not None and verb != only:
            continue
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


_PACKAGES = tuple(str(Path(__file__).resolve().parents[1] / name)
                  for name in ("assets", "decode", "drafters", "speceval", "train"))  # drafterkit's own


@contextlib.contextmanager
def user_warnings():
    """While a verb runs, drafterkit's own ``UserWarning``s (a torn data file, fewer prompts than asked)
    print as one line, ``drafterkit: warning: <message>``, on a line of their own, instead of Python's
    ``path:line: UserWarning: ...`` followed by the source line. Other warnings keep Python's format."""
    plain = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):
        if issubclass(category, UserWarning) and str(Path(filename).resolve()).startswith(_PACKAGES):
            return f"\ndrafterkit: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = fmt
    try:
        yield
    finally:
        warnings.formatwarning = plain


def requested_verb(argv: list[str]) -> str:
    """The verb ``argv`` names (its first word that is a verb), or ``""`` when it names none (``--help``, a
    typo: the top-level parser answers those without importing any verb module)."""
    return next((a for a in argv if a in VERBS), "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(build_parser(only=requested_verb(argv)), argv)
    if getattr(args, "_missing", None):
        print(f"drafterkit {args.verb}: not available in this build ({args._missing} missing)", file=sys.stderr)
        return 2
    with user_warnings():
        return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
