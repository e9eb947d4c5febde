"""Training strategies: one per drafter kind, all with the same small interface.

A strategy tells the generic loop (``train/loop.py``) four things about its drafter kind: how to
build the trainable module, how to check a batch, how to compute the loss, and how to save. Add a
kind by writing ``train/strategies/<kind>.py`` with a class following :class:`Strategy` and one line
in :data:`STRATEGIES`. The loop never looks inside a drafter.

Contract (what the loop guarantees and expects):

* ``build(recipe, target, tokenizer)`` is called once, before ``accelerator.prepare``; ``target`` is
  frozen (``requires_grad=False``, eval mode) and must stay so; return a ``drafters.Drafter`` whose
  trainable parameters have ``requires_grad=True`` (only those are optimised). ``recipe.drafter.options``
  has been validated by ``options_model`` (read it with ``recipe.drafter.parsed_options()``).
* ``check_batch(batch)`` runs on every batch before ``loss``; raise ``ValueError`` naming the missing
  key / bad shape and the fix. A batch holds ``input_ids``, ``attention_mask``, ``loss_mask`` (LongTensor
  ``[B, T]``, right-padded, from ``train.data.collate``) and may hold ``on_policy: bool`` (DistillSpec
  batches; a strategy that cannot serve them raises there) or, when the recipe reads the offline feature
  cache (``data.feature_cache``), ``features [B, T, F]`` and ``feature_layers`` (``train/feature_cache.py``;
  only kinds with ``feature_layers(recipe, target)`` may ask for one).
* ``loss(drafter, target, batch, recipe)`` returns ``(loss, metrics)``: a scalar tensor, the MEAN over
  the batch's supervised units (positions, or chain starts for the chained kinds, see ``train/losses.py``),
  and a dict of floats to log that holds ``tokens``, the number of those units. The loop trains on
  ``loss * tokens`` summed over the optimizer step's micro-batches and processes, divided by the step's
  total ``tokens`` (so an update never depends on how a batch is split); it logs token means of the step. ``drafter`` may be the
  accelerate-wrapped module: call it, do not assume its type (``unwrap(drafter)`` gives the Drafter).
  Target forwards must run under ``torch.no_grad()``.
* ``save(drafter, path)`` writes a folder loadable by ``drafters.load_drafter(path, target)``.
* Optional ``validate_recipe(recipe)``: called by the recipe validator (``train.recipe.Recipe``), so
  ``load_recipe`` refuses, before any model loads, what the kind cannot train (a loss term it cannot
  apply, on-policy data for the head kinds, an option value the target cannot serve); raise
  ``ValueError`` whose message starts with the recipe key (``loss.name: ...``) and names the kind and
  the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import BaseModel


@runtime_checkable
class Strategy(Protocol):
    """The four-method interface every drafter kind implements for training."""

    kind: str
    options_model: type[BaseModel]

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        """The trainable drafter (a ``drafters.Drafter``)."""

    def check_batch(self, batch: dict[str, Any]) -> None:
        """Raise ``ValueError`` with a clear message if ``batch`` cannot be trained on."""

    def loss(self, drafter: torch.nn.Module, target: torch.nn.Module, batch: dict[str, Any],
             recipe: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss (with grad) and float metrics."""

    def save(self, drafter: torch.nn.Module, path: str | Path) -> None:
        """Write a checkpoint folder loadable with ``drafters.load_drafter``."""


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / accelerate wrappers (``.module``) and ``torch.compile`` (``._orig_mod``)."""
    while True:
        if hasattr(module, "module") and isinstance(module.module, torch.nn.Module):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            return module


def check_common_batch(batch: dict[str, Any]) -> None:
    """The checks every kind shares: ``input_ids``, ``attention_mask``, ``loss_mask`` LongTensors ``[B, T]``.

    Raises:
        ValueError: a key is missing, not a tensor, not 2-D, or the shapes differ.
    """
    need = ("input_ids", "attention_mask", "loss_mask")
    missing = [k for k in need if k not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing}; build batches with train.data.collate (keys {list(need)})")
    shape = None
    for k in need:
        v = batch[k]
        if not isinstance(v, torch.Tensor) or v.dim() != 2:
            raise ValueError(f"batch[{k!r}] must be a 2-D tensor [B, T], got "
                             f"{type(v).__name__}{'' if not isinstance(v, torch.Tensor) else tuple(v.shape)}")
        if shape is not None and v.shape != shape:
            raise ValueError(f"batch[{k!r}] has shape {tuple(v.shape)} but input_ids has {tuple(shape)}")
        shape = v.shape


# Kind modules import the helpers above, so they are imported after them.
from train.strategies.draft_lm import DraftLMStrategy  # noqa: E402

from train.strategies.eagle import EagleStrategy  # noqa: E402
from train.strategies.eagle3 import Eagle3Strategy  # noqa: E402
from train.strategies.medusa import MedusaStrategy  # noqa: E402

STRATEGIES: dict[str, Strategy] = {
    "draft_lm": DraftLMStrategy(),
    "medusa": MedusaStrategy(),
    "eagle": EagleStrategy(),
    "eagle3": Eagle3Strategy(),
}


def get_strategy(kind: str) -> Strategy:
    """The strategy for drafter ``kind``. Raises ``ValueError`` listing the trainable kinds."""
    if kind not in STRATEGIES:
        raise ValueError(f"no training strategy for drafter kind {kind!r}; trainable kinds: {sorted(STRATEGIES)}")
    return STRATEGIES[kind]


__all__ = ["STRATEGIES", "Strategy", "check_common_batch", "get_strategy", "unwrap"]
