"""Console helpers every verb shares, training and evaluation alike: the ``rich`` console drafterkit's tables
print to, and the switch for progress bars. Imports nothing heavy (no torch), so a verb that only prints a
table (``drafterkit assets list``) starts at once."""

from __future__ import annotations

import contextlib
import os

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
