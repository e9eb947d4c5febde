"""drafterkit's speculative decoder: proposal, verification, KV-cache bookkeeping, metrics, benchmarks.

``generate`` is the public entry point (the project's decoder contract; metric definitions in
``decode/metrics.py`` and README "Evaluation"). Importing the package stays light: the engine (and
transformers) load on first use of ``generate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decode.engine import GenerateResult, generate
    from decode.metrics import DecodeStats
    from decode.tree import DraftTree

__all__ = ["DecodeStats", "DraftTree", "GenerateResult", "generate"]


def __getattr__(name: str):
    if name in ("generate", "GenerateResult"):
        from decode import engine

        return getattr(engine, name)
    if name == "DecodeStats":
        from decode.metrics import DecodeStats

        return DecodeStats
    if name == "DraftTree":
        from decode.tree import DraftTree

        return DraftTree
    raise AttributeError(f"module 'decode' has no attribute {name!r}")
