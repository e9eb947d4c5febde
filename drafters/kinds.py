"""The drafter kinds, each declared once: :data:`KINDS` maps a kind name to its :class:`Kind` entry.

A kind ``K`` lives in its own module ``drafters/K.py`` (its config dataclass and its ``Drafter``
subclass, whose ``propose`` is how it decodes); a trainable kind also has ``train/strategies/K.py``
(its training strategy) and its ``drafter.options`` model in ``train/options.py``. The training side
keeps one table of its own, ``train.options.KINDS`` (one line per trainable kind: options model,
strategy, recipe check), because this package ranks below training and must not name it; a test
(``tests/test_train_recipe.py``) checks that table lists exactly the kinds marked ``trainable`` here.

Adding a kind: write ``drafters/K.py`` (and, when it trains, ``train/strategies/K.py`` with its options
model), then add one line below (and its line in ``train.options.KINDS``). The loader, ``export``,
training and the conformance test (``tests/test_drafters_conformance.py``) find it from here.

This module imports nothing heavy: the classes load on first use (:meth:`Kind.drafter_class`), so one
kind's missing optional piece never breaks another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One drafter kind.

    Attributes:
        name: the kind as ``config.json`` and recipes spell it (``drafter.kind``).
        drafter: the ``Drafter`` subclass's name in the kind's module ``drafterkit.drafters.<name>``.
        config: its config dataclass's name in the same module (the class's ``config_class``).
        trainable: it has a training strategy (``train/strategies/<name>.py``); prompt lookup has none.
        exports: the ``drafterkit export --format`` names that take this kind (``drafters.export``).
        trees: its drafter drafts static and dynamic trees (``propose_tree`` and ``propose_dynamic_tree``);
            False for a chain-only kind (DFlash: one block pass drafts one chain), which ``drafterkit eval``,
            ``tune`` and ``quickstart`` refuse to measure as a tree when their flags are validated.
    """

    name: str
    drafter: str
    config: str
    trainable: bool = True
    exports: tuple[str, ...] = ()
    trees: bool = True

    @property
    def module(self) -> str:
        """The kind's own module, ``drafterkit.drafters.<name>``."""
        return f"drafterkit.drafters.{self.name}"

    def drafter_class(self):
        """The ``Drafter`` subclass (imports the kind's module). Raises ``ImportError`` if it is missing."""
        return getattr(importlib.import_module(self.module), self.drafter)

    def config_class(self):
        """The config dataclass (imports the kind's module)."""
        return getattr(importlib.import_module(self.module), self.config)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("draft_lm", "DraftLM", "DraftLMConfig", exports=("hf-assistant",)),
    Kind("ngram", "NGramDrafter", "NGramConfig", trainable=False),
    Kind("medusa", "MedusaDrafter", "MedusaConfig", exports=("medusa",)),
    Kind("eagle", "EagleDrafter", "EagleConfig"),
    Kind("eagle3", "Eagle3Drafter", "Eagle3Config", exports=("vllm-eagle3", "sglang-eagle3")),
    Kind("dflash", "DFlashDrafter", "DFlashConfig", exports=("vllm-dflash",), trees=False),
    Kind("suffix", "SuffixDrafter", "SuffixConfig", trainable=False),
    Kind("peagle", "PEagleDrafter", "PEagleConfig", exports=("vllm-peagle",)),
    Kind("dspark", "DSparkDrafter", "DSparkConfig", exports=("vllm-dspark",), trees=False),
)}


def trainable_kinds() -> list[str]:
    """The kinds with a training strategy, sorted."""
    return sorted(name for name, k in KINDS.items() if k.trainable)


def chain_only_kinds() -> list[str]:
    """The kinds whose drafters draft chains only (``Kind.trees`` False), sorted."""
    return sorted(name for name, k in KINDS.items() if not k.trees)


def max_draft_tokens(kind: str, config: dict) -> int | None:
    """The most draft tokens a ``kind`` drafter whose ``config.json`` holds ``config`` proposes in one round:
    Medusa's ``num_heads`` (one head per position), DFlash's ``block_size - 1`` and DSpark's ``block_size`` (one
    block pass); ``None`` for
    the kinds without a fixed bound (they draft one token per step, as many as asked)."""
    if kind == "medusa":
        return int(config["num_heads"])
    if kind == "dflash":
        return int(config["block_size"]) - 1
    if kind == "dspark":
        return int(config["block_size"])
    return None


def export_formats() -> dict[str, str]:
    """``drafterkit export --format`` name -> the kind it exports, from every kind's ``exports``."""
    return {fmt: k.name for k in KINDS.values() for fmt in k.exports}
