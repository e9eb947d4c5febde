"""The tree round of the decoding engine: static trees and EAGLE-2 dynamic trees, one target forward each.

A static tree (:class:`decode.tree.DraftTree`) has one shape for every row: the proposer fills it
(``propose_tree``), nodes no row may use are dropped, and the target scores ``[last, nodes..]`` under
the tree's attention mask (SpecInfer, Miao et al. 2024; Medusa; EAGLE). A dynamic tree
(:class:`decode.dynamic_tree.DynamicTree`, EAGLE-2, Li et al. 2024) has a shape per row and per round:
the proposer grows it (``propose_dynamic_tree``) and returns each row's :class:`DraftTree`; the target
scores every row's own nodes in the same forward under a per-row mask (rows with smaller trees are
padded with nodes no one may accept). Both then run the same verification (``verify_tree_greedy`` /
``verify_tree_sampling``), move the accepted path's cache columns and features into place and commit
through the steps the chain round shares (``decode.decoder``). Statistics count per depth: a tree's
``drafted`` is the nodes verified, ``accept_per_position[i]`` the acceptance at depth ``i + 1``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from drafterkit.decode.decoder import (
    Decoder,
    commit,
    hidden,
    notify,
    proposer_view,
    screen_ids,
    store_features,
    sync,
    timed_proposal,
)
from drafterkit.decode.dynamic_tree import DynamicTree
from drafterkit.decode.sampling import logits_to_probs, select_tokens
from drafterkit.decode.tree import DraftTree, close_under_parents
from drafterkit.decode.verify import verify_tree_greedy, verify_tree_sampling

#: what is done with a tree node whose id lies outside the vocabulary (the bad-id warning says it)
DROPPED = "Those nodes and their subtrees are not verified"


def batch_tree_inputs(trees: list[DraftTree | None], n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row RoPE offsets ``[B, n + 1]`` and tree attention ``[B, n + 1, n + 1]`` over ``[root, node_0 ..
    node_{n-1}]`` for rows drafting different trees; a row's columns past its own nodes are padding
    (offset 1, attending the root and themselves). Each row's tree has at most ``n`` nodes."""
    b = len(trees)
    depths = torch.ones(b, n + 1, dtype=torch.long)
    depths[:, 0] = 0
    mask = torch.eye(n + 1, dtype=torch.bool).repeat(b, 1, 1)
    mask[:, :, 0] = True
    for i, t in enumerate(trees):
        if t is not None:
            m = t.num_nodes
            depths[i, 1: m + 1] = torch.tensor(t.depths)
            mask[i, : m + 1, : m + 1] = t.attention_mask()
    return depths.to(device), mask.to(device)


def close_rows_under_parents(trees: list[DraftTree | None], valid: torch.Tensor) -> torch.Tensor:
    """``valid [B, N]`` with every node whose parent is invalid set invalid, row ``b``'s nodes following
    ``trees[b]`` (None or padding columns: parent = the root)."""
    b, n = valid.shape
    par = torch.full((b, n), -1, dtype=torch.long)
    for i, t in enumerate(trees):
        if t is not None:
            par[i, : t.num_nodes] = torch.tensor(t.parents)
    par = par.to(valid.device)
    has = par >= 0
    depth = max([t.max_depth for t in trees if t is not None] + [1])
    for _ in range(depth - 1):
        valid = valid & torch.where(has, valid.gather(1, par.clamp(min=0)), torch.ones_like(valid))
    return valid


def _proposal_mask(dec: Decoder, prop, where: str, n: int) -> torch.Tensor:
    b = len(dec.tokens)
    valid = torch.ones(b, n, dtype=torch.bool, device=dec.device)
    if prop.mask is not None:
        m = torch.as_tensor(prop.mask)
        if tuple(m.shape) != (b, n):
            raise ValueError(f"{where} returned a mask of shape {tuple(m.shape)}; need [B, N] = [{b}, {n}]")
        valid &= m.to(dec.device).bool()
    return valid


def _usable(dec: Decoder, where: str, d: torch.Tensor, valid: torch.Tensor, depth: torch.Tensor,
            caps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree tokens ``d [B, N]`` with bad ids replaced by 0 (:func:`decode.decoder.screen_ids`) and ``valid``
    without those nodes, nodes of finished rows and nodes deeper than each row's cap (``depth [N]`` or
    ``[B, N]``)."""
    d, bad = screen_ids(dec, where, d, valid, DROPPED)
    act = torch.tensor(dec.active, device=dec.device)[:, None]
    deep = depth.to(dec.device) > torch.tensor(caps, device=dec.device)[:, None]
    return d, valid & ~bad & act & ~deep


def propose_static(dec: Decoder, caps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The proposer's tree tokens ``[B, N]`` and the nodes each row may have verified ``[B, N]``: its mask, cut
    at invalid ids, at each row's depth cap, finished rows empty, closed under parents."""
    tree, n = dec.tree, dec.tree.num_nodes
    prop, d = timed_proposal(dec, "propose_tree", n, " (one token per tree node)", proposer_view(dec), tree,
                             dec.sampling, dec.gen)
    where = f"{type(dec.proposer).__name__}.propose_tree"
    d, valid = _usable(dec, where, d, _proposal_mask(dec, prop, where, n), torch.tensor(tree.depths)[None], caps)
    return d, close_under_parents(tree, valid)


def propose_dynamic(dec: Decoder, caps: list[int]) -> tuple[torch.Tensor, torch.Tensor, list]:
    """A dynamic tree round's proposal: tokens ``[B, N]``, the nodes each row may have verified ``[B, N]``
    (its own nodes, cut as in :func:`propose_static`) and each row's tree.

    Raises:
        ValueError: ``Proposal.trees`` is not one ``DraftTree`` (or None) per row of at most N nodes.
    """
    spec, b = dec.tree.capped(max(caps)), len(dec.tokens)
    prop, d = timed_proposal(dec, "propose_dynamic_tree", None, " (each row's tree nodes, padded)",
                             proposer_view(dec), spec, dec.sampling, dec.gen)
    where, n = f"{type(dec.proposer).__name__}.propose_dynamic_tree", d.shape[1]
    trees = prop.trees
    if (not isinstance(trees, (list, tuple)) or len(trees) != b
            or any(t is not None and (not isinstance(t, DraftTree) or t.num_nodes > n) for t in trees)):
        raise ValueError(f"{where} must return Proposal.trees: one decode.tree.DraftTree (or None) per row "
                         f"({b}), each of at most N={n} nodes (the columns of its tokens)")
    trees = list(trees)
    count = torch.tensor([0 if t is None else t.num_nodes for t in trees], device=dec.device)
    valid = _proposal_mask(dec, prop, where, n) & (torch.arange(n, device=dec.device)[None] < count[:, None])
    depth = torch.ones(b, n, dtype=torch.long)
    for i, t in enumerate(trees):
        if t is not None:
            depth[i, : t.num_nodes] = torch.tensor(t.depths)
    d, valid = _usable(dec, where, d, valid, depth, caps)
    return d, close_rows_under_parents(trees, valid), trees


def propose_tree(dec: Decoder, caps: list[int]) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """This round's ``(tokens [B, n], valid [B, n], shape)``: ``shape`` is the static tree pruned to the nodes
    some row may use, or the per-row trees cut to the last column some row may use, or None when no row has
    a node to verify (then ``n == 0``)."""
    b = len(dec.tokens)
    if max(caps) <= 0:  # only the last token is left to commit: nothing to draft
        empty = torch.zeros(b, 0, dtype=torch.long, device=dec.device)
        return empty, empty.bool(), None
    if isinstance(dec.tree, DynamicTree):
        d, valid, trees = propose_dynamic(dec, caps)
        used = valid.any(0).nonzero()
        n = int(used.max()) + 1 if used.numel() else 0
        cut = [None if t is None or n == 0 else (t if t.num_nodes <= n else
                                                 t.subtree([True] * n + [False] * (t.num_nodes - n))[0])
               for t in trees]
        return d[:, :n], valid[:, :n], (cut if n else None)
    d, valid = propose_static(dec, caps)
    keep = valid.any(0).tolist()
    tree, idx = (dec.tree.subtree(keep) if any(keep) else (None, []))
    return d[:, idx], valid[:, idx], tree


def tree_forward(dec: Decoder, d: torch.Tensor, shape):
    """ONE target forward over ``[last, nodes..]`` (tokens ``d [B, n]``; a plain step when ``shape`` is None):
    the target's output, logits ``[B, n + 1, V]`` (``[B, 1, V]`` for a plain step)."""
    want_h = dec.layers is not None
    if shape is None:
        return dec.cache.run(dec.last_tokens(), logits_to_keep=1, output_hidden_states=want_h)
    if isinstance(shape, DraftTree):
        depths = torch.tensor((0,) + shape.depths, device=dec.device)
        mask = shape.attention_mask(dec.device)
    else:
        depths, mask = batch_tree_inputs(shape, d.shape[1], dec.device)
    return dec.cache.run_tree(torch.cat([dec.last_tokens(), d], 1), depths, mask, logits_to_keep=d.shape[1] + 1,
                              output_hidden_states=want_h)


def tree_round(dec: Decoder) -> None:
    """One tree round: propose a tree (static or dynamic), ONE target forward over ``[last, nodes..]`` under
    tree attention, follow the accepted path, move its cache columns and features into place, commit. Nodes
    no row may use are dropped before the forward; with none left it is a plain step."""
    active = dec.active
    caps = [min(dec.k_max, dec.max_new - len(o) - 1) if a else 0 for o, a in zip(dec.out, active)]
    d, valid, shape = propose_tree(dec, caps)
    t0 = time.perf_counter()
    n_real_before = dec.cache.n_real.tolist()
    out = tree_forward(dec, d, shape)
    logits = out.logits[..., : dec.vocab]  # [B, N+1, V]
    if shape is None:  # no node to verify: a plain step
        paths = [[] for _ in active]
        nxt = select_tokens(logits[:, 0], dec.sampling, dec.vocab, dec.gen)[0].tolist()
    elif dec.sampling.greedy:
        paths, nxt = verify_tree_greedy(logits, shape, d, valid)
    else:
        paths, nxt = verify_tree_sampling(logits_to_probs(logits, dec.sampling), shape, d, valid, dec.gen)
    paths = [p if a else [] for p, a in zip(paths, active)]
    cols = [[0] + [c + 1 for c in p] for p in paths]  # the pass's columns each row keeps, root first
    vmax = max(len(c) if a else 0 for c, a in zip(cols, active))
    index = torch.tensor([c + [0] * (vmax - len(c)) for c in cols], dtype=torch.long, device=dec.device)
    if shape is not None and vmax > 1:
        dec.cache.reorder(index)
    kept = [len(c) if a else 0 for c, a in zip(cols, active)]
    dec.cache.keep(torch.tensor(kept, device=dec.device), valid_max=vmax)
    if dec.layers is not None:
        h = hidden(dec, out)
        if vmax:
            h = h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1]))
        store_features(dec, h, n_real_before, kept, [0] * len(cols))
    toks, ok = d.tolist(), valid.tolist()
    rows = shape if isinstance(shape, list) else [shape] * len(active)
    for b, a in enumerate(active):
        if a:
            end = paths[b][-1] if paths[b] else -1
            judged = rows[b] is not None and any(ok[b][c] for c in rows[b].children[end])  # a child of the last
            commit(dec, b, [toks[b][c] for c in paths[b]], nxt[b], drafted=sum(ok[b]), judged_past=judged)
    sync(dec.device)
    dec.counts.verify_time_s += time.perf_counter() - t0
    dec.round += 1
    notify(dec)
