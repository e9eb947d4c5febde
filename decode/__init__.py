"""drafterkit's speculative decoder core: the proposer protocol, the engine (propose -> verify ->
accept), the KV cache and its rollback, greedy and exact sampling verification, chains and trees,
stop handling and metrics. It imports no other package of drafterkit. ``decode/reference.py`` is one round
(batch 1, greedy, chains) in one short file: read it first.

``generate`` is the public entry point (the project's decoder contract; metric definitions in
``decode/metrics.py`` and docs/evaluation.md, "Metrics"); ``exact_mode`` switches on the bitwise-exact mode
(greedy speculative decoding token-identical to plain decoding in bf16 on a CPU, at ~5-11% of tokens/s;
``decode/exact.py``), off by default; ``compiled_mode`` compiles the target's passes (``torch.compile``,
``decode/compiled.py``), off by default.
"""

from __future__ import annotations

from drafterkit.decode.compiled import compiled_mode
from drafterkit.decode.engine import GenerateResult, generate
from drafterkit.decode.exact import exact_mode, exact_mode_enabled
from drafterkit.decode.metrics import DecodeStats
from drafterkit.decode.tree import DraftTree

__all__ = ["DecodeStats", "DraftTree", "GenerateResult", "compiled_mode", "exact_mode", "exact_mode_enabled",
           "generate"]
