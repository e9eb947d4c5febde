"""The strategy interface (:class:`Strategy`, the contract in ``train.strategies``) and what every kind
shares: :func:`unwrap` (the drafter under accelerate / DDP / ``torch.compile`` wrappers) and
:func:`check_common_batch`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import BaseModel


@runtime_checkable
class Strategy(Protocol):
    """The interface every drafter kind implements for training."""

    kind: str
    options_model: type[BaseModel]

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        """The trainable drafter (a ``drafters.Drafter``)."""

    def check_batch(self, batch: dict[str, Any]) -> None:
        """Raise ``ValueError`` with a clear message if ``batch`` cannot be trained on."""

    def units(self, batch: dict[str, Any], recipe: Any) -> int:
        """The supervised units ``loss`` will average over (its ``metrics["tokens"]``), from the batch alone,
        before any forward: the training step sums them over the optimizer step first."""

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
