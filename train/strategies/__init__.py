"""Training strategies: one per drafter kind, all with the same small interface.

A strategy tells the generic loop (``train/loop.py``) five things about its drafter kind: how to
build the trainable module, how to check a batch, how many supervised units a batch holds, how to
compute the loss, and how to save. Add a
kind by writing ``train/strategies/<kind>.py`` with a class following :class:`Strategy`
(``train/strategies/base.py``) and naming it, with the kind's options model and recipe check, in the
kind's one line of ``train.options.KINDS`` (the recipe layer: it validates ``drafter.options`` before any
model loads; :func:`get_strategy` imports the strategy's module on first use). The loop never looks inside a drafter.

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
  total ``tokens`` (so an update never depends on how a batch is split); it logs token means of the step.
  ``drafter`` may be the accelerate-wrapped module: call it, do not assume its type (``unwrap(drafter)``
  gives the Drafter).
  Target forwards must run under ``torch.no_grad()``.
* ``units(batch, recipe)`` counts, from the batch alone (no forward), the supervised units ``loss`` will
  report as ``metrics["tokens"]``: the loop sums them over every micro-batch of every process before the
  step's first backward and scales each micro-batch's loss by one over that count (``train.step``); a loss
  that reports another count stops training with a RuntimeError.
* ``save(drafter, path)`` writes a folder loadable by ``drafters.load_drafter(path, target)``.
* ``options_model`` is the kind's ``train.options.KINDS[kind].options_model``; what the kind cannot train
  (a loss term it cannot apply, on-policy data for the head kinds, an option value the target cannot
  serve) is refused by the kind's recipe check there, when the recipe is validated.
* Kinds that train from target features (``train.options.KINDS[kind].reads_features``) have
  ``feature_layers(recipe, target)``: the ``hidden_states`` ids the loss reads, what the offline feature
  cache holds.
"""

from __future__ import annotations

import importlib
from functools import cache

from drafterkit.train.options import KINDS
from drafterkit.train.strategies.base import Strategy, check_common_batch, unwrap


@cache
def get_strategy(kind: str) -> Strategy:
    """The strategy for drafter ``kind`` (one instance per kind): the class ``train.options.KINDS[kind]``
    names in ``drafterkit.train.strategies.<kind>``. Raises ``ValueError`` listing the trainable kinds."""
    if kind not in KINDS:
        raise ValueError(f"no training strategy for drafter kind {kind!r}; trainable kinds: {sorted(KINDS)}")
    return getattr(importlib.import_module(f"drafterkit.train.strategies.{kind}"), KINDS[kind].strategy)()


__all__ = ["Strategy", "check_common_batch", "get_strategy", "unwrap"]
