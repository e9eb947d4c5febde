"""Compiling the target's graphs (:func:`warm_up`) and a drafter's (:func:`warm_up_proposer`) before anything is timed,
for ``decode.compiled_mode``."""

from __future__ import annotations

import time

import torch
from torch import nn

from drafterkit.decode import attention, compact, compiled, few_rows
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.fused import fused_projections


def warm_up(model: nn.Module, hidden_states=(False,), widest: int = few_rows.ROWS) -> float:
    """Compile, before anything is timed, every graph a batch-1 decode of ``model`` uses: a decoding step (no mask)
    and a pass of several tokens (a mask: chains' and trees' verification; ``widest``: the most tokens one holds, a
    tree's nodes and the root: past :data:`decode.few_rows.ROWS` a pass is a graph of its own), each with and without
    hidden states as ``hidden_states`` lists (True where the drafter reads the target's features). Returns the
    seconds it took; 0 where the target's passes would not run compiled (compiled mode off, exact mode, a model
    :func:`decode.compact.compact_problem` refuses)."""
    if not compiled.ENABLED or attention.EXACT or compact.compact_problem(model) is not None:
        return 0.0
    device = next(model.parameters()).device
    start = time.perf_counter()
    with torch.inference_mode(), fused_projections(model):
        for hidden in sorted(set(hidden_states)):
            cache = RaggedCache(model, 1, device, capacity=32, compiled=True)
            cache.prefill([list(range(1, 9))], logits_to_keep=1)
            for m in (1, 3) + ((widest,) if widest > few_rows.ROWS else ()):
                cache.run(torch.ones(1, m, dtype=torch.long, device=device), logits_to_keep=m,
                          output_hidden_states=hidden)
                cache.keep(torch.ones(1, dtype=torch.long, device=device))
    return time.perf_counter() - start


def warm_up_proposer(proposer, k: int = 5) -> float:
    """Compile, before anything is timed, the graphs of a drafter that runs its own drafting passes compiled
    (:func:`decode.compiled.runs_compiled`; its ``warm_up_compiled(k)`` method), itself or wrapped as ``.drafter``
    (``drafters.lookup.hybrid.LookupHybrid``), for chains of ``k`` draft tokens (and trees). Returns the seconds it
    took; 0 where nothing compiles."""
    start = time.perf_counter()
    for module in (proposer, getattr(proposer, "drafter", None)):
        warm = getattr(module, "warm_up_compiled", None)
        if callable(warm) and compiled.runs_compiled(module):
            warm(k)
    return time.perf_counter() - start
