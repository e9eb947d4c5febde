"""A recipe's draft lengths against what its drafter drafts in one round, checked when the recipe is validated.

Medusa drafts at most ``num_heads`` tokens a round, DFlash ``block_size - 1`` (its block's masked positions) and
DSpark ``block_size`` (its first position drafts too): the same bounds as ``drafters.kinds.max_draft_tokens`` reads
from a saved drafter's config (``tests/test_train_recipe.py`` checks they agree), here from ``drafter.options``
without importing the drafters (and torch). ``eval.k`` (draft tokens per verification in the in-training
evaluation) and, with the ``accept_len`` term, ``loss.draft_steps`` (its chain's length) above that bound would be
cut to it without a word; :func:`fit_draft_lengths` cuts a default and refuses a value the recipe gives.
"""

from __future__ import annotations

from typing import Any

#: kind -> (the drafter option that bounds its draft tokens per round, bound = option value + this offset)
BOUNDS = {"medusa": ("num_heads", 0), "dflash": ("block_size", -1), "dspark": ("block_size", 0)}


def draft_bound(kind: str, options: dict) -> tuple[int, str] | None:
    """``(the most draft tokens one round of a kind drafter proposes, the option that sets it)`` for the
    ``drafter.options`` dict ``options`` (defaults filled in), or None for a kind without a fixed bound."""
    if kind not in BOUNDS:
        return None
    option, offset = BOUNDS[kind]
    return int(options[option]) + offset, option


def fit_draft_lengths(recipe: Any) -> None:
    """``eval.k`` and, with ``accept_len`` among the loss terms, ``loss.draft_steps`` against the drafter's
    :func:`draft_bound`: left at its default, a value above the bound becomes the bound (set on ``recipe``, so the
    saved recipe holds what runs); given above it, refused.

    Raises:
        ValueError: one line naming the key, the kind, the bound and both fixes.
    """
    found = draft_bound(recipe.drafter.kind, recipe.drafter.options)
    if found is None:
        return
    most, option = found
    lengths = [(recipe.eval, "eval.k", "k")]
    if "accept_len" in recipe.loss.terms():
        lengths.append((recipe.loss, "loss.draft_steps", "draft_steps"))
    for section, key, field in lengths:
        value = getattr(section, field)
        if value <= most:
            continue
        if field not in section.model_fields_set:  # the default: it follows the drafter's bound
            setattr(section, field, most)
            continue
        have = recipe.drafter.options[option]
        raise ValueError(f"{key}: {value} is more than drafter kind {recipe.drafter.kind!r} drafts in one round "
                         f"({most} tokens with drafter.options.{option}: {have}); set {key} to at most {most}, or "
                         f"drafter.options.{option} to at least {value + have - most}")
