"""``drafterkit eval --compile``: the graphs its rows use compiled before anything is timed, said on stderr.

Compiling takes minutes on a CPU (``decode.compiled``: 10-110 s a graph on 2 cores), so :func:`compile_graphs` says
what it compiles before it starts and how long it took when done; the record keeps the seconds
(``timings["compile_s"]``).
"""

from __future__ import annotations

import os
import sys
import typing

from drafterkit.decode.compact import compact_problem
from drafterkit.decode.compiled import compiled_mode, runs_compiled
from drafterkit.decode.dynamic_tree import DynamicTree, parse_tree
from drafterkit.decode.few_rows import ROWS
from drafterkit.decode.warm import warm_up, warm_up_proposer


def inductor_cache_dir() -> str:
    """Where TorchInductor keeps the kernels it generates (``TORCHINDUCTOR_CACHE_DIR``, else its default folder)."""
    if found := os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return found
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    except (ImportError, AttributeError):  # another torch layout: name the setting instead
        return "TORCHINDUCTOR_CACHE_DIR"


def _drafts_compiled(drafter) -> bool:
    """Whether ``drafter`` (or the drafter a lookup hybrid wraps, its ``.drafter``) drafts through graphs of its own
    (``decode.compiled.runs_compiled``)."""
    return any(runs_compiled(m) for m in (drafter, getattr(drafter, "drafter", None)) if m is not None)


def verified_rows(spec, k: int) -> int:
    """The most tokens a verification pass of ``spec``'s row holds: its tree's nodes and the root, else its chain's K
    (``spec.k``, else ``k``) and the root."""
    if spec.tree is not None:
        try:
            tree = parse_tree(spec.tree)
        except (ValueError, TypeError):  # a spec eval resolves later ("auto"): its chain's rows
            return (spec.k or k) + 1
        return (tree.total if isinstance(tree, DynamicTree) else tree.num_nodes) + 1
    return (spec.k or k) + 1


def compile_graphs(target, specs: typing.Sequence, log: typing.TextIO | None = None, k: int = 5) -> float | None:
    """Compile every graph the rows of ``specs`` (``speceval.methods.DrafterSpec``) use next to ``target`` in
    ``decode.compiled_mode``: the target's decoding step and verification pass (with hidden states too where a
    drafter reads them; ``decode.warm.warm_up``) and the drafters' own drafting graphs (``warm_up_proposer``). One
    line on ``log`` (default stderr) before, naming what compiles, that it takes minutes on a CPU and where the
    kernels are cached, and one after with the seconds it took. ``k``: the rows' chain K where a spec has none.

    Returns:
        the seconds it took, or None where the target's passes cannot run compiled
        (``decode.compact.compact_problem``, said in one line): compiled mode is then turned off, so the eval runs
        every pass uncompiled, the drafters' too (none compiles inside the timed prompts).
    """
    log = log or sys.stderr
    if (problem := compact_problem(target)) is not None:
        print(f"drafterkit eval: --compile: the target's passes run uncompiled: {problem}; so do the drafters'",
              file=log)
        compiled_mode(False)  # evaluate()'s compiled_mode context restores the mode found before on exit
        return None
    hidden = {False} | {getattr(s.drafter, "feature_layers", None) is not None for s in specs}
    heads = list(dict.fromkeys(s.label.split(" ")[0] for s in specs if _drafts_compiled(s.drafter)))
    widest = max([verified_rows(s, k) for s in specs], default=1)
    what = f"{(2 + (widest > ROWS)) * len(hidden)} graphs of the target's passes" + (
        f" and the drafting graphs of {', '.join(heads)}" if heads else "")
    print(f"drafterkit eval: --compile: compiling {what} before anything is timed; this takes minutes on a CPU "
          f"(TorchInductor caches the kernels in {inductor_cache_dir()}, so a later run compiles faster)",
          file=log, flush=True)
    seconds = warm_up(target, hidden, widest) + sum(warm_up_proposer(s.drafter, s.k or k) for s in specs)
    print(f"drafterkit eval: --compile: compiled in {seconds:.1f} s", file=log, flush=True)
    return seconds
