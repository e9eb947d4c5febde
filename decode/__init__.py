"""drafterkit's speculative decoder core: the proposer protocol, the engine (propose -> verify ->
accept), the KV cache and its rollback, greedy and exact sampling verification, chains and trees,
stop handling and metrics. It imports no other package of drafterkit.

``generate`` is the public entry point (the project's decoder contract; metric definitions in
``decode/metrics.py`` and docs/evaluation.md, "Metrics").
"""

from __future__ import annotations

from drafterkit.decode.engine import GenerateResult, generate
from drafterkit.decode.metrics import DecodeStats
from drafterkit.decode.tree import DraftTree

__all__ = ["DecodeStats", "DraftTree", "GenerateResult", "generate"]
