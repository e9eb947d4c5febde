"""The strategy interface (:class:`Strategy`, with :class:`FeatureStrategy` and :class:`OnPolicyStrategy`)
and what every kind shares: :func:`unwrap` (the drafter under accelerate / DDP / ``torch.compile`` wrappers) and
:func:`check_common_batch`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import BaseModel


@runtime_checkable
class Strategy(Protocol):
    """The interface every drafter kind implements for training; the generic loop (``train.loop``,
    ``train.step``) never looks inside a drafter.

    ``kind`` is the kind's name; ``options_model`` its ``train.options.KINDS[kind].options_model`` (the
    pydantic model of ``drafter.options``). What a kind cannot train (a loss term it cannot apply, on-policy
    data for the head kinds, an option value the target cannot serve) is refused by the kind's recipe check in
    ``train.options``, when the recipe is validated, never here at step 1.
    """

    kind: str
    options_model: type[BaseModel]

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        """The trainable drafter (a ``drafters.Drafter``), called once before the engine wraps it. ``target`` is
        frozen (``requires_grad=False``, eval mode) and must stay so; only parameters with ``requires_grad`` are
        optimised; ``recipe.drafter.parsed_options()`` holds the validated options."""

    def check_batch(self, batch: dict[str, Any]) -> None:
        """Check one batch before :meth:`loss`: ``input_ids``, ``attention_mask``, ``loss_mask`` (LongTensor
        ``[B, T]``, right-padded, ``train.data.collate``), maybe ``on_policy: bool`` (DistillSpec) or, from the
        offline feature cache, ``features [B, T, F]`` and ``feature_layers``.

        Raises:
            ValueError: a missing key or bad shape, naming the fix.
        """

    def units(self, batch: dict[str, Any], recipe: Any) -> int:
        """The supervised units (positions, or chain starts for the chained kinds, ``train.losses``) that
        :meth:`loss` will average over and report as ``metrics["tokens"]``, counted from the batch alone (no
        forward): the step sums them over every micro-batch and process before its first backward."""

    def loss(self, drafter: torch.nn.Module, target: torch.nn.Module, batch: dict[str, Any],
             recipe: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, metrics)``: a scalar with grad, the MEAN over the batch's :meth:`units`, and floats to log
        holding ``tokens`` (that count; another count stops training with a RuntimeError). ``drafter`` may be
        wrapped by the engine: call it, or :func:`unwrap` it. Target forwards run under ``torch.no_grad()``."""

    def save(self, drafter: torch.nn.Module, path: str | Path) -> None:
        """Write a folder loadable with ``drafters.load_drafter(path, target)``."""


@runtime_checkable
class FeatureStrategy(Strategy, Protocol):
    """A kind that trains from the target's hidden states (``train.options.KINDS[kind].reads_features``):
    EAGLE, EAGLE-3, P-EAGLE, Medusa, DFlash."""

    def feature_layers(self, recipe: Any, target: torch.nn.Module) -> list[int]:
        """The ``hidden_states`` indices (0 = embeddings, ``L`` = the final-norm last layer) the loss reads:
        what the offline feature cache (``train.feature_cache``) holds for this kind."""


@runtime_checkable
class OnPolicyStrategy(Strategy, Protocol):
    """A kind that trains on its own samples (DistillSpec on-policy data, ``data.on_policy_fraction``):
    ``draft_lm``."""

    def on_policy_batch(self, drafter: torch.nn.Module, target: torch.nn.Module, batch: dict[str, Any],
                        recipe: Any) -> dict[str, torch.Tensor]:
        """``batch`` with each row's response replaced by a sample from the drafter (same keys, ``[B, T']``),
        so that the step can count its units before any backward."""


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
