"""A DFlash-family drafter's round compiled (``decode.compiled_mode``): the context keys/values of the new feature
rows, the block pass and the draft logits, one graph (:func:`block_pass`).

DFlash (``drafters/dflash.py``) and DSpark (``drafters/dspark.py``) draft a block in one pass, but eagerly that pass
is dozens of small operations per layer (the fc over new feature rows, per-layer key/value projections, cats, the
block's attention, the MLP, the LM head) whose Python and dispatch cost more than their arithmetic on a CPU at
batch 1. Here they run as one graph compiled by TorchInductor with its ``freezing`` option
(:func:`decode.compiled.module_call`), its bf16 linear layers of a few rows through :mod:`decode.few_rows`' kernel,
as the EAGLE-family heads' passes do (``drafters/heads/compiled_steps.py``). A greedy DSpark chain (no threshold,
no confidence cut) is drafted in the same graph, its Markov head left to right; elsewhere the choice of draft tokens
runs after it.

The graph computes from a copy of the drafter's weights made when it is built; a decode that starts after they
changed builds it again (:func:`decode.compiled.runs_compiled`). Exact mode and compiled mode off run the eager
code (:meth:`drafters.dflash.DFlashDrafter.block_hidden`).
"""

from __future__ import annotations

import torch
from torch import nn

from drafterkit.decode import compiled, few_rows
from drafterkit.drafters.heads.compiled_steps import graph_copy

#: feature rows an eager first pass leaves in the warm-up's context (:func:`warm_up`)
WARM_CONTEXT = 12


class BlockPass(nn.Module):
    """A copy of a DFlash-family drafter whose forward is one drafting round for one row; see :func:`block_pass`."""

    def __init__(self, drafter: nn.Module):
        super().__init__()
        self.drafter = graph_copy(drafter)
        self.first = 0 if drafter.anchor_predicts else 1

    def forward(self, feats: torch.Tensor, ctx_pos: torch.Tensor, past, ids: torch.Tensor, pos: torch.Tensor,
                chain: bool = False, vocab_size: int = 0):
        d = self.drafter
        new = d.context_kv(d.context(feats), ctx_pos)
        kv = tuple((torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(past, new))
        hidden = d.block(ids, pos, kv, None)[:, self.first:]
        logits = d.draft_logits(hidden)
        if not chain:
            return kv, hidden, logits
        return kv, hidden, logits, d.greedy_chain(logits, ids[:, 0], vocab_size)


def block_pass(drafter: nn.Module, row: int, tokens: list[int], features: torch.Tensor, stable: int,
               slots: int | None = None, chain: bool = False, vocab_size: int = 0):
    """Decoder row ``row``'s block pass compiled, its context cache brought up to date; or ``None`` where it does not
    run compiled and the caller runs the eager code: compiled mode off, exact mode, off the CPU, a failed compile (said
    once), or a context cache of fewer than 2 stable rows or with no new row (the graphs specialise sizes 0 and 1, so
    the first round of a prompt runs eagerly and every later one reuses the graphs :func:`warm_up` built).

    Args:
        drafter: a ``drafters.dflash.DFlashDrafter`` (DSpark included). row: the decoder row. tokens: its committed
            tokens. features: ``[len(tokens) - 1, nF*H]`` its target features. stable: its ``num_stable`` (the
            context rows of a prefix still committed). slots: the block's draft positions S
            (``DFlashDrafter.block_hidden``). chain: the same graph goes on to draft the greedy chain of every
            position (DSpark's ``greedy_chain``, over the target's ``vocab_size`` ids).

    Returns:
        ``(hidden [1, S, H] pre-norm, logits [1, S, N] draft-vocabulary)``, as ``DFlashDrafter.block_outputs``; with
        ``chain``, and the chain's draft tokens ``[1, S]`` (target ids).
    """
    dev = drafter.fc.weight.device
    if not compiled.drafts_compiled(drafter, dev):
        return None
    m, cache = features.shape[0], drafter._caches[row]
    valid = 0 if cache is None else min(cache["rows"], stable, m)
    if valid < 2 or valid == m:
        return None
    past = tuple((k[:, :, :valid], v[:, :, :valid]) for k, v in cache["kv"])
    first = 0 if drafter.anchor_predicts else 1
    blk = (slots or drafter.slots_for(drafter.config.block_size)) + first
    ids = torch.full((1, blk), drafter.config.mask_token_id, dtype=torch.long, device=dev)
    ids[0, 0] = tokens[-1]
    pos = torch.arange(len(tokens) - 1, len(tokens) - 1 + blk, device=dev)[None]
    ctx_pos = torch.arange(valid, m, device=dev)[None]
    got = compiled.module_call(drafter, lambda: BlockPass(drafter), features[valid:m].to(dev)[None], ctx_pos, past,
                               ids, pos, bool(chain), int(vocab_size))
    if got is None:
        return None
    drafter._caches[row] = {"rows": m, "kv": list(got[0])}
    return got[1:]


def warm_up(drafter: nn.Module, k: int = 5) -> None:
    """Compile the graphs a batch-1 decode with chains of ``k`` draft tokens uses (``decode.warm.warm_up_proposer``
    calls it, through ``warm_up_compiled``, before anything is timed): rounds after one and after several new context
    rows (up to ``k + 1``, a chain all accepted and its bonus token, where that is more rows than
    :data:`decode.few_rows.ROWS`), over the context an eager first round of :data:`WARM_CONTEXT` rows leaves, and the
    same with the greedy chain where the drafter drafts it in the graph (``greedy_chain``). Inputs are zeros of the
    decode's shapes; the drafter's caches are as they were."""
    kept = drafter.__dict__.get("_caches")
    p = drafter.fc.weight
    slots = drafter.slots_for(k)
    try:
        with torch.inference_mode():  # as a decode runs: its tensors' dispatch keys are guarded too
            feats = torch.zeros(WARM_CONTEXT + max(k + 1, 3), p.shape[1], dtype=p.dtype, device=p.device)
            for new in sorted({1, 3} | ({k + 1} if k + 1 > few_rows.ROWS else set())):
                drafter.reset(1)
                drafter._context_rows([0], [feats[:WARM_CONTEXT]], [WARM_CONTEXT])
                m = WARM_CONTEXT + new
                for chain in (False, True) if hasattr(drafter, "greedy_chain") else (False,):
                    drafter._caches[0]["rows"] = WARM_CONTEXT
                    block_pass(drafter, 0, [0] * (m + 1), feats[:m], m, slots, chain, drafter.config.vocab_size)
    finally:
        if kept is None:
            drafter.__dict__.pop("_caches", None)
        else:
            drafter._caches = kept
