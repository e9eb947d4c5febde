"""Drafter definitions (draft LM, Medusa, EAGLE, EAGLE-3, n-gram): modules, save/load, export.

``KINDS`` maps each kind name to its class; modules register themselves here by import below.
``load_drafter(path, target)`` reads the kind from ``config.json`` and loads strictly.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from drafters.base import Drafter, DrafterLoadError, read_config

# kind -> "module:Class". Imported lazily so one kind's missing optional piece never breaks another.
_KIND_PATHS = {
    "draft_lm": "drafters.draft_lm:DraftLM",
    "ngram": "drafters.ngram:NGramDrafter",
    "medusa": "drafters.medusa:MedusaDrafter",
    "eagle": "drafters.eagle:EagleDrafter",
    "eagle3": "drafters.eagle3:Eagle3Drafter",
}


def get_kind(kind: str) -> type[Drafter]:
    """The drafter class for ``kind``. Raises ``ValueError`` naming the valid kinds."""
    if kind not in _KIND_PATHS:
        raise ValueError(f"unknown drafter kind {kind!r}; valid kinds: {sorted(_KIND_PATHS)}")
    module, cls = _KIND_PATHS[kind].split(":")
    return getattr(importlib.import_module(module), cls)


KINDS = _KIND_PATHS  # names only; use get_kind() for the class


def load_drafter(path: str | Path, target=None) -> Drafter:
    """Load any drafterkit checkpoint folder; ``target`` supplies modules borrowed from it."""
    kind, _ = read_config(path)
    return get_kind(kind).from_pretrained(path, target=target)


__all__ = ["Drafter", "DrafterLoadError", "KINDS", "get_kind", "load_drafter"]
