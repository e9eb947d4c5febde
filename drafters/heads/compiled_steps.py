"""A feature head's drafting pass compiled (``decode.compiled_mode``): the head over new positions and the draft logits
of its outputs, one graph per shape (:func:`head_pass`).

The head's layers, its feature projection and its LM head run as one graph compiled by TorchInductor with its
``freezing`` option (:func:`decode.compiled.module_call`): no Python per layer, the elementwise work fused, and a
drafting step of one row (a chain at batch 1) takes the faster, timed when it compiles, of inductor's C++ GEMM
template and oneDNN's call for each linear layer, as the target's decoding step does (``decode/compiled.py``). The
graph computes from a copy of the head's weights (its constants), made when it is built; a decode that starts after
the head's weights changed (a training step between two evaluations) builds it again
(:func:`decode.compiled.runs_compiled`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from drafterkit.decode import compiled, few_rows
from drafterkit.decode.sampling import mask_unproposable
from drafterkit.drafters.heads.layers import causal_mask


def graph_copy(drafter: nn.Module) -> nn.Module:
    """A copy of ``drafter`` for a compiled graph to freeze: its caches emptied (``reset(0)``), the engine's per-decode
    layer swaps (``decode.fused``) left out, its bf16 linear layers of a few rows through :mod:`decode.few_rows`'
    kernel, and RoPE's inverse frequencies made now rather than by the graph's first call (which would guard on them
    being None)."""
    copied = copy.deepcopy(drafter)
    for module in copied.modules():
        module.__dict__.pop("forward", None)
    compiled.few_row_linears(copied)
    copied.reset(0)
    device = next(copied.parameters()).device
    for module in copied.modules():
        if getattr(module, "_inv_freq", False) is None:
            module.rope(torch.zeros(1, 1, dtype=torch.long, device=device), torch.float32)
    return copied


class HeadPass(nn.Module):
    """A copy of a feature head (``drafters.heads.feature_head.FeatureHeadDrafter``) whose forward is one drafting
    pass; see :func:`head_pass` for the arguments."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = graph_copy(head)

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past,
                real: bool, keep: int, chain: int = 0, vocab_size: int = 0):
        if real:
            hidden = self.head.real_input(hidden)
        out, kv = self.head._layer(ids, hidden, positions, mask, past)
        logits, _ = self.head.logits_and_ids(out[:, -keep:] if keep else out)
        if not chain:
            return out, kv, logits
        return self._chain(out[:, -1:], kv, logits[:, -1:], positions[:, -1:], chain, vocab_size), kv, out, logits

    def _chain(self, h: torch.Tensor, past, logits: torch.Tensor, position: torch.Tensor, k: int, vocab_size: int):
        """``k`` greedy draft tokens ``[1, k]`` (target ids) from the head's output ``h [1, 1, H]`` at ``position``
        and its logits ``[1, 1, V']``: each step the argmax (draft ids mapping to ids >= ``vocab_size`` left out),
        then the head over (that token, ``h``) at the next position, as ``FeatureHeadDrafter._propose_row``."""
        ids = self.head.draft_id_map()
        drafted = []
        for i in range(k):
            token = mask_unproposable(logits[:, -1].float(), ids, vocab_size).argmax(-1)  # [1]
            token = ids[token] if ids is not None else token
            drafted.append(token)
            if i + 1 < k:
                position = position + 1
                mask = torch.ones(1, past[0][0].shape[2] + 1, dtype=torch.bool, device=h.device)
                h, past = self.head._layer(token[:, None], h, position, mask, past)
                logits, _ = self.head.logits_and_ids(h)
        return torch.stack(drafted, 1)


def head_pass(head: nn.Module, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
              past, real: bool, keep: int, chain: int = 0, vocab_size: int = 0):
    """The head over ``m`` new positions and the draft logits of its last ``keep`` outputs (0: all), compiled; or
    ``None`` where it does not run compiled (:func:`decode.compiled.module_call`: compiled mode off, exact mode, off
    the CPU, a failed compile, said once), and the caller runs the head's eager code. With ``chain = k > 0`` the same
    graph goes on to draft a greedy chain of ``k`` tokens from the last output: one call per round instead of one per
    draft token (the Python and dispatch between steps is most of a small head's step on a CPU).

    Every compiled pass extends a cache of 2 positions or more: a first pass (``past`` None, the prompt's catch-up)
    runs all but its last :data:`TAIL` positions (or ``keep``, if more) eagerly and those over the cache they leave,
    so a prompt of any length reuses the graphs :func:`warm_up` built (a graph guards whether ``past`` is None, sizes
    of 0 and 1, and whether a pass fits :mod:`decode.few_rows`' kernel); passes over a shorter cache run eagerly.

    Args:
        ids: ``[B, m]`` the token each position consumes. hidden: ``[B, m, F]`` target features when ``real``
            (the head's ``real_input`` maps them), else ``[B, m, H]`` head outputs. positions: ``[B, m]`` RoPE
            positions. mask: ``[m, S]`` or ``[B, 1, m, S]`` bool, True where a query may attend a key (causal when
            ``past`` is None). past: per layer ``(k, v)`` ``[B, n_kv, S - m, d]``, or None. chain: draft tokens to
            chain after the pass (``B`` = 1), 0 for none. vocab_size: the target's vocabulary (draft ids mapping past
            it are never drafted).

    Returns:
        ``(out [B, m, H], per-layer (k, v) [B, n_kv, S, d], logits [B, keep or m, V'])``; with ``chain``,
        ``(draft tokens [1, chain] (target ids), per-layer (k, v), out, logits)``: the keys/values are the pass's
        (the chain's own steps are not cached).
    """
    m = ids.shape[1]
    if not m or not compiled.drafts_compiled(head, ids.device):
        return None
    # a graph specializes sizes 0 and 1: every compiled pass extends a cache of at least 2 positions
    tail = m if past is not None else min(m - 2, max(TAIL, keep))  # the positions that run compiled
    if (past is not None and past[0][0].shape[2] < 2) or tail < max(keep, 1):
        return None
    p = m - tail  # positions run eagerly first (a first pass)
    if p:
        h = head.real_input(hidden[:, :p]) if real else hidden[:, :p]
        first, past = head._layer(ids[:, :p], h, positions[:, :p], mask[..., :p, :p], None)
        ids, hidden, positions, mask = ids[:, p:], hidden[:, p:], positions[:, p:], mask[..., p:, :]
    got = compiled.module_call(head, lambda: HeadPass(head), ids, hidden, positions, mask, past, bool(real),
                               int(keep), int(chain), int(vocab_size), one_row=ids.shape[0] * ids.shape[1] == 1)
    if not p or got is None:
        return got
    out = torch.cat([first, got[2 if chain else 0]], 1)
    logits = got[-1]
    if not keep:  # every position's logits: the eager ones' too
        logits = torch.cat([head.logits_and_ids(first)[0], logits], 1)
    return (got[0], got[1], out, logits) if chain else (out, got[1], logits)


#: the most positions of a first pass (no cache yet) that run compiled (:func:`head_pass`): a pass of 2 to
#: ``decode.few_rows.ROWS`` rows is one graph (:mod:`decode.few_rows`' kernel serves them all)
TAIL = 4

#: the drafting passes a batch-1 decode of an EAGLE-family head compiles, over a cache: catch-ups of one and of
#: several accepted positions, each ``(positions, real, keep, chain)`` as :func:`head_pass` takes them (``chain``: K)
GREEDY_CHAINS = ((1, True, 1, "k"), (3, True, 1, "k"))
#: and where it draws its chains (sampling, a confidence cut: a step at a time) or drafts trees: catch-ups, a chain's
#: drafting step, tree levels of one and of several nodes
STEPS_AND_TREES = ((1, True, 1, 0), (3, True, 1, 0), (1, False, 1, 0), (1, False, 0, 0), (3, False, 0, 0))


def warm_up(head: nn.Module, passes=None, k: int = 5) -> None:
    """Compile every graph of ``passes`` (``decode.warm.warm_up_proposer`` calls it before anything is timed), each
    ``(positions, real, keep, chain)`` (``"k"``: ``k``) over the cache of 12 positions an eager pass leaves; by default
    :data:`GREEDY_CHAINS` and :data:`STEPS_AND_TREES`, and catch-ups of ``k + 1`` positions (a chain all accepted and
    its bonus token) where that is more rows than :data:`decode.few_rows.ROWS`. Inputs are zeros of the decode's
    shapes."""
    if passes is None:
        wide = ((k + 1, True, 1, "k"), (k + 1, True, 1, 0)) if k + 1 > few_rows.ROWS else ()
        passes = GREEDY_CHAINS + STEPS_AND_TREES + wide
    p = next(head.parameters())
    hidden, width = head.config.hidden_size, len(head.feature_layers) * head.config.hidden_size

    def run(m: int, past, real: bool, keep: int, chain: int = 0):
        s = 0 if past is None else past[0][0].shape[2]
        ids = torch.ones(1, m, dtype=torch.long, device=p.device)
        feats = torch.zeros(1, m, width if real else hidden, dtype=head._dtype(), device=p.device)
        return head_pass(head, ids, feats, torch.arange(s, s + m, device=p.device)[None], causal_mask(m, s, p.device),
                         past, real, keep, k if chain == "k" else chain, head.target_vocab_size())

    with torch.inference_mode():
        m = 12
        ids = torch.ones(1, m, dtype=torch.long, device=p.device)
        feats = head.real_input(torch.zeros(1, m, width, dtype=head._dtype(), device=p.device))
        _, past = head._layer(ids, feats, torch.arange(m, device=p.device)[None], causal_mask(m, 0, p.device), None)
        for shape in passes:
            run(*shape[:1], past, *shape[1:])
