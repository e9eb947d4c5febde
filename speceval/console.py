"""The ``rich`` console drafterkit's tables print to. Imports nothing heavy (no torch), so a verb that only
prints a table (``drafterkit assets list``) starts at once."""

from __future__ import annotations

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
