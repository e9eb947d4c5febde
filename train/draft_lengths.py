"""A recipe's draft lengths against what its drafter drafts in one round, checked when the recipe is validated.

Medusa drafts at most ``num_heads`` tokens a round, DFlash ``block_size - 1`` (its block's masked positions) and
DSpark ``block_size`` (its first position drafts too): the same bounds as ``drafters.kinds.max_draft_tokens`` reads
from a saved drafter's config (``tests/test_train_recipe.py`` checks they agree), here from ``drafter.options``
without importing the drafters (and torch). ``eval.k`` (draft tokens per verification in the in-training
evaluation) and, with the ``accept_len`` term, ``loss.draft_steps`` (its chain's length) above that bound would be
cut to it without a word; :func:`fit_draft_lengths` cuts a default and refuses a value the recipe gives. The same
holds for ``loss.draft_steps`` with ``accept_len`` against the chain a kind TRAINS (:data:`TRAINED_CHAINS`: EAGLE and
EAGLE-3 unroll ``ttt_steps``, P-EAGLE trains ``num_depths`` positions), though they draft longer chains at decode time.
"""

from __future__ import annotations

from typing import Any

#: kind -> (the drafter option that bounds its draft tokens per round, bound = option value + this offset)
BOUNDS = {"medusa": ("num_heads", 0), "dflash": ("block_size", -1), "dspark": ("block_size", 0)}
#: kind -> the drafter option that sets how many steps one training chain holds (accept_len's K at most)
TRAINED_CHAINS = {"eagle": "ttt_steps", "eagle3": "ttt_steps", "peagle": "num_depths"}


def draft_bound(kind: str, options: dict) -> tuple[int, str] | None:
    """``(the most draft tokens one round of a kind drafter proposes, the option that sets it)`` for the
    ``drafter.options`` dict ``options`` (defaults filled in), or None for a kind without a fixed bound."""
    if kind not in BOUNDS:
        return None
    option, offset = BOUNDS[kind]
    return int(options[option]) + offset, option


def fit_draft_lengths(recipe: Any) -> None:
    """``eval.k`` and, with ``accept_len`` among the loss terms, ``loss.draft_steps`` against the drafter's
    :func:`draft_bound`; ``loss.draft_steps`` with ``accept_len`` against the trained chain of
    :data:`TRAINED_CHAINS`. Left at its default, a value above the bound becomes the bound (set on ``recipe``, so
    the saved recipe holds what runs); given above it, refused.

    Raises:
        ValueError: one line naming the key, the kind, the bound and both fixes.
    """
    kind, options = recipe.drafter.kind, recipe.drafter.options
    accept_len = "accept_len" in recipe.loss.terms()
    if (found := draft_bound(kind, options)) is not None:
        most, option = found
        _fit(recipe.eval, "eval.k", "k", most, option, options[option], f"drafts in one round ({most} tokens", kind)
        if accept_len:
            _fit(recipe.loss, "loss.draft_steps", "draft_steps", most, option, options[option],
                 f"drafts in one round ({most} tokens", kind)
    if accept_len and kind in TRAINED_CHAINS:
        option = TRAINED_CHAINS[kind]
        most = int(recipe.drafter.parsed_options().model_dump()[option])
        _fit(recipe.loss, "loss.draft_steps", "draft_steps", most, option, most, f"trains in one chain ({most} steps",
             kind)


def _fit(section: Any, key: str, field: str, most: int, option: str, have: int, what: str, kind: str) -> None:
    """Cut ``section.field`` to ``most`` where it was left at its default, refuse it where the recipe gave it
    (``what``: the bound in words, e.g. "drafts in one round (7 tokens"; ``have``: ``option``'s value)."""
    value = getattr(section, field)
    if value <= most:
        return
    if field not in section.model_fields_set:  # the default: it follows the drafter's bound
        setattr(section, field, most)
        return
    raise ValueError(f"{key}: {value} is more than drafter kind {kind!r} {what} with drafter.options.{option}: "
                     f"{have}); set {key} to at most {most}, or drafter.options.{option} to at least "
                     f"{value + have - most}")
