"""What every command says when a drafter checkpoint is used with another target than the one it was trained for:
:func:`trained_for_problem` resolves the checkpoint path (``drafters.resolve_checkpoint``) and asks
:func:`drafters.target.record.drafter_problem` (the rules, and the record read, are described there)."""

from __future__ import annotations

from pathlib import Path

from drafterkit.drafters import resolve_checkpoint
from drafterkit.drafters.base import DrafterLoadError
from drafterkit.drafters.target.record import (drafter_problem, shapes_match, target_from_records, trained_target,
                                               vocabulary_difference)


def trained_for_problem(folder: str | Path, target: str, *, label: str | None = None,
                        flag: str = "--target") -> str | None:
    """The warning line for the drafter checkpoint ``folder`` (anything ``drafters.resolve_checkpoint`` accepts)
    used with ``target`` (a name, folder or Hub id, as ``flag`` gave it), or None (see
    :func:`drafters.target.record.drafter_problem`; also None for a path holding no drafter: loading it reports
    that). ``label`` names the drafter in the line (default: the resolved folder).

    Raises:
        DrafterLoadError: the recorded target's tokenizer maps tokens to other ids than ``target``'s (both
            loadable here): the head's draft ids would name other tokens. The message names both targets and the fix.
    """
    try:
        folder, kind = resolve_checkpoint(folder)
    except DrafterLoadError:
        return None  # loading the drafter reports it
    return drafter_problem(folder, kind, target, label=label, flag=flag)


__all__ = ["shapes_match", "target_from_records", "trained_for_problem", "trained_target",
           "vocabulary_difference"]
