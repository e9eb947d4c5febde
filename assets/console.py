"""Console helpers every verb shares, training and evaluation alike: the ``rich`` console drafterkit's tables
print to, the switch for progress bars, drafterkit's warnings as one line (:func:`user_warnings`) and the
third-party notices that say nothing about the run (:func:`datasets_quiet`, :func:`deepspeed_quiet`). Imports
nothing heavy (no torch), so a verb that only prints a table (``drafterkit assets list``) starts at once."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

MIN_TABLE_WIDTH = 160  # columns: the eval table's headers stay legible in a pipe, a log or CI


def make_console(file=None, min_width: int = MIN_TABLE_WIDTH):
    """A ``rich`` Console for the tables. Not a terminal (a pipe, a log file, CI): width at least
    ``min_width`` columns, since rich would otherwise fall back to 80 and squash the headers to one
    letter per line; a real terminal keeps its own width."""
    from rich.console import Console

    console = Console(file=file)
    if not console.is_terminal:
        console = Console(file=file, width=max(console.width, min_width))
    return console


#: seconds between two refreshes of a progress bar written to a log or a pipe (:func:`progress_for_logs`)
LOG_REFRESH_S = 30


def progress_for_logs(stream=None) -> None:
    """Where ``stream`` (default stderr) is not a terminal (a log file, ``nohup``, CI), progress bars refresh every
    :data:`LOG_REFRESH_S` seconds instead of ten times a second: each refresh there is one more line, thousands over a
    training run. Through tqdm's ``TQDM_MININTERVAL``, which tqdm reads when it is imported: called before that (the
    CLI does, first), every bar of the process follows it (drafterkit's, transformers' and datasets'); a value the
    user set wins."""
    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        os.environ.setdefault("TQDM_MININTERVAL", str(LOG_REFRESH_S))


def disable_progress_bars() -> None:
    """Silence every progress bar of this process (``--no-progress``): tqdm's default (``TQDM_DISABLE=1``,
    which drafterkit's own bars also honour, see :func:`progress_bars_off`), transformers' (weight
    loading) and datasets' (dataset building)."""
    os.environ["TQDM_DISABLE"] = "1"
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()


def progress_bars_off() -> bool:
    """True when ``TQDM_DISABLE`` asks for no progress bars (set by :func:`disable_progress_bars`)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def datasets_quiet():
    """Within it, ``datasets`` draws no progress bars of its own ("Generating train split", "Map", "Saving the
    dataset"): written to a log or a pipe, every refresh of one is a line, ~60 for one training set. drafterkit's
    own bars (training, the feature cache) are unaffected. The earlier state is restored on exit."""
    import datasets

    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


#: drafterkit's own package folders (this file is ``<root>/assets/console.py``, in the repository as installed)
_PACKAGES = tuple(str(Path(__file__).resolve().parents[1] / name)
                  for name in ("assets", "decode", "drafters", "speceval", "train"))


@contextlib.contextmanager
def user_warnings():
    """Within it, drafterkit's own ``UserWarning``s (a torn data file, fewer prompts than asked) print as one
    line, ``drafterkit: warning: <message>``, on a line of their own, instead of Python's ``path:line:
    UserWarning: ...`` followed by the source line, and each such message once: a verb that reads the same data
    twice (the quickstart plans the feature cache, then trains) warns once. Other warnings keep Python's format
    and its own repetition rules. Every entry point wraps its verb in it: ``drafterkit VERB`` and ``python -m
    drafterkit.train`` (what ``torchrun`` and ``accelerate launch`` start in each process)."""
    plain, show, seen = warnings.formatwarning, warnings.showwarning, set()

    def ours(category, filename) -> bool:
        return issubclass(category, UserWarning) and str(Path(filename).resolve()).startswith(_PACKAGES)

    def fmt(message, category, filename, lineno, line=None):
        if ours(category, filename):
            return f"\ndrafterkit: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    def show_once(message, category, filename, lineno, file=None, line=None):
        if ours(category, filename):
            if str(message) in seen:
                return
            seen.add(str(message))
        show(message, category, filename, lineno, file, line)

    warnings.formatwarning, warnings.showwarning = fmt, show_once
    try:
        yield
    finally:
        warnings.formatwarning, warnings.showwarning = plain, show


class _DropAcceleratorGuess(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Setting accelerator to CPU" not in record.getMessage()


@contextlib.contextmanager
def deepspeed_quiet():
    """Within it, DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
    detect it." is dropped. Where DeepSpeed is installed, accelerate imports it whatever the run (its
    ``extract_model_from_parallel``, behind every ``unwrap_model`` and transformers' ``save_pretrained``, looks
    for DeepSpeed's engine class), and its import logs that guess on a machine without a GPU: noise for a run
    that uses no DeepSpeed engine, and a ZeRO run sets and checks DeepSpeed's accelerator against its own device
    itself (``train.zero.check_zero_request``, one line naming a mismatch). Nothing else DeepSpeed logs is
    filtered; the filter sits on the ``DeepSpeed`` logger before DeepSpeed creates it, and is removed on exit."""
    flt, logger = _DropAcceleratorGuess(), logging.getLogger("DeepSpeed")
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


class Parser(argparse.ArgumentParser):
    """argparse's parser for drafterkit's commands, but a usage error prints the error and where the options are,
    not the whole usage first (a verb's usage runs to a screenful and buried the line naming the problem and fix).
    Exits 2, as argparse does."""

    def error(self, message: str):  # argparse's hook
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the options)\n")
