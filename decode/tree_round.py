"""Tree rounds of the decoding engine: static trees and EAGLE-2 dynamic trees, one target forward each.

A static tree (:class:`decode.tree.DraftTree`) has one shape for every row: the proposer fills it
(``propose_tree``), nodes no row may use are dropped, and the target scores ``[last, nodes..]`` under
the tree's attention mask (SpecInfer, Miao et al. 2024; Medusa; EAGLE). A dynamic tree
(:class:`decode.dynamic_tree.DynamicTree`, EAGLE-2, Li et al. 2024) has a shape per row and per round:
the proposer grows it (``propose_dynamic_tree``) and returns each row's :class:`DraftTree`; the target
scores every row's own nodes in the same forward under a per-row mask (rows with smaller trees are
padded with nodes no one may accept). Both then run the same verification (``verify_tree_greedy`` /
``verify_tree_sampling``), move the accepted path's cache columns and features into place and commit.
"""

from __future__ import annotations

import time
import warnings

import torch

from drafterkit.decode.dynamic_tree import DynamicTree
from drafterkit.decode.sampling import greedy_logits, logits_to_probs, select_tokens
from drafterkit.decode.tree import DraftTree, close_under_parents
from drafterkit.decode.verify import verify_tree_greedy, verify_tree_sampling


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU), so timings are of finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


class TreeRounds:
    """The tree rounds of ``decode.engine._Decoder`` (a mixin: every attribute is the decoder's)."""

    def _drop_bad_ids(self, where: str, d: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``valid`` without the nodes whose ids lie outside the vocabulary (warned once per call)."""
        bad = (d < 0) | (d >= self.vocab)
        act = torch.tensor(self.active, device=self.device)
        if not self._warned_ids and bool((bad & valid & act[:, None]).any()):
            self._warned_ids = True
            ids = sorted(set(d[bad & valid & act[:, None]].tolist()))[:5]
            warnings.warn(f"{where} returned token ids {ids} outside [0, {self.vocab}) (the target's "
                          "vocabulary): a proposer contract violation. Those nodes and their subtrees are not "
                          "verified (output stays exact); fix the proposer. Warned once per generate call",
                          stacklevel=3)
        return valid & ~bad & act[:, None]

    def _proposal_mask(self, prop, where: str, b: int, n: int) -> torch.Tensor:
        valid = torch.ones(b, n, dtype=torch.bool, device=self.device)
        if prop.mask is not None:
            m = torch.as_tensor(prop.mask)
            if tuple(m.shape) != (b, n):
                raise ValueError(f"{where} returned a mask of shape {tuple(m.shape)}; need [B, N] = [{b}, {n}]")
            valid &= m.to(self.device).bool()
        return valid

    def _propose_tree(self, caps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposer's tree tokens ``[B, N]`` and the nodes each row may have verified ``[B, N]``:
        its mask, cut at invalid ids, at each row's depth cap, inactive rows empty, closed under parents."""
        tree, b, n = self.tree, len(self.tokens), self.tree.num_nodes
        prop, d = self._timed_proposal("propose_tree", n, " (one token per tree node)", self._state(), tree,
                                       self.sampling, self.gen)
        where = f"{type(self.proposer).__name__}.propose_tree"
        valid = self._drop_bad_ids(where, d, self._proposal_mask(prop, where, b, n))
        depth = torch.tensor(tree.depths, device=self.device)
        valid &= depth[None] <= torch.tensor(caps, device=self.device)[:, None]
        return d.masked_fill((d < 0) | (d >= self.vocab), 0), close_under_parents(tree, valid)

    def _propose_dynamic(self, caps: list[int]) -> tuple[torch.Tensor, torch.Tensor, list]:
        """A dynamic tree round's proposal: tokens ``[B, N]``, the nodes each row may have verified
        ``[B, N]`` (its own nodes, cut as in :meth:`_propose_tree`) and each row's tree.

        Raises:
            ValueError: ``Proposal.trees`` is not one ``DraftTree`` (or None) per row of at most N nodes.
        """
        spec, b = self.tree.capped(max(caps)), len(self.tokens)
        prop, d = self._timed_proposal("propose_dynamic_tree", None, " (each row's tree nodes, padded)",
                                       self._state(), spec, self.sampling, self.gen)
        where, n = f"{type(self.proposer).__name__}.propose_dynamic_tree", d.shape[1]
        trees = prop.trees
        if (not isinstance(trees, (list, tuple)) or len(trees) != b
                or any(t is not None and (not isinstance(t, DraftTree) or t.num_nodes > n) for t in trees)):
            raise ValueError(f"{where} must return Proposal.trees: one decode.tree.DraftTree (or None) per row "
                             f"({b}), each of at most N={n} nodes (the columns of its tokens)")
        trees = list(trees)
        count = torch.tensor([0 if t is None else t.num_nodes for t in trees], device=self.device)
        valid = self._proposal_mask(prop, where, b, n) & (torch.arange(n, device=self.device)[None] < count[:, None])
        valid = self._drop_bad_ids(where, d, valid)
        depth = torch.ones(b, n, dtype=torch.long)
        for i, t in enumerate(trees):
            if t is not None:
                depth[i, : t.num_nodes] = torch.tensor(t.depths)
        valid &= depth.to(self.device) <= torch.tensor(caps, device=self.device)[:, None]
        return d.masked_fill((d < 0) | (d >= self.vocab), 0), close_rows_under_parents(trees, valid), trees

    def _tree_proposal(self, caps: list[int]):
        """This round's ``(tokens [B, n], valid [B, n], shape)``: ``shape`` is the static tree pruned to
        the nodes some row may use, or the per-row trees cut to the last column some row may use, or
        None when no row has a node to verify (then ``n == 0``)."""
        b = len(self.tokens)
        if max(caps) <= 0:  # only the last token is left to commit: nothing to draft
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), torch.zeros(b, 0, dtype=torch.bool,
                                                                                        device=self.device), None
        if isinstance(self.tree, DynamicTree):
            d, valid, trees = self._propose_dynamic(caps)
            used = valid.any(0).nonzero()
            n = int(used.max()) + 1 if used.numel() else 0
            cut = [None if t is None or n == 0 else (t if t.num_nodes <= n else
                                                     t.subtree([True] * n + [False] * (t.num_nodes - n))[0])
                   for t in trees]
            return d[:, :n], valid[:, :n], (cut if n else None)
        d, valid = self._propose_tree(caps)
        keep = valid.any(0).tolist()
        tree, idx = (self.tree.subtree(keep) if any(keep) else (None, []))
        return d[:, idx], valid[:, idx], tree

    def _tree_forward(self, d: torch.Tensor, shape):
        """ONE target forward over ``[last, nodes..]`` (a plain step when ``shape`` is None)."""
        last = torch.tensor([[t[-1]] for t in self.tokens], dtype=torch.long, device=self.device)
        want_h = self.layers is not None
        if shape is None:
            return self.cache.run(last, logits_to_keep=1, output_hidden_states=want_h)
        if isinstance(shape, DraftTree):
            depths = torch.tensor((0,) + shape.depths, device=self.device)
            mask = shape.attention_mask(self.device)
        else:
            depths, mask = batch_tree_inputs(shape, d.shape[1], self.device)
        return self.cache.run_tree(torch.cat([last, d], 1), depths, mask, logits_to_keep=d.shape[1] + 1,
                                   output_hidden_states=want_h)

    def step_tree(self) -> None:
        """One tree round: propose a tree (static or dynamic), ONE target forward over ``[last, nodes..]``
        under tree attention, follow the accepted path, move its cache columns and features into place,
        commit. Nodes no row may use are dropped before the forward; with none left it is a plain step."""
        active = self.active
        caps = [min(self.tree.max_depth, self.max_new - len(o) - 1) if a else 0 for o, a in zip(self.out, active)]
        d, valid, shape = self._tree_proposal(caps)
        t0 = time.perf_counter()
        n_real_before = self.cache.n_real.tolist()
        out = self._tree_forward(d, shape)
        logits = out.logits[..., : self.vocab]  # [B, N+1, V]
        if shape is None:  # no node to verify: a plain step
            paths = [[] for _ in active]
            nxt = select_tokens(logits[:, 0], self.sampling, self.vocab, self.gen)[0].tolist()
        elif self.sampling.greedy:
            paths, nxt = verify_tree_greedy(greedy_logits(logits), shape, d, valid)
        else:
            paths, nxt = verify_tree_sampling(logits_to_probs(logits, self.sampling), shape, d, valid, self.gen)
        paths = [p if a else [] for p, a in zip(paths, active)]
        cols = [[0] + [c + 1 for c in p] for p in paths]
        vmax = max(len(c) if a else 0 for c, a in zip(cols, active))
        index = torch.tensor([c + [0] * (vmax - len(c)) for c in cols], dtype=torch.long, device=self.device)
        if shape is not None and vmax > 1:
            self.cache.reorder(index)
        counts = torch.tensor([len(c) if a else 0 for c, a in zip(cols, active)], device=self.device)
        self.cache.keep(counts, valid_max=vmax)
        if self.layers is not None:
            h = self._hidden(out)
            if vmax:
                h = h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1]))
            self._store_features(h, n_real_before, counts.tolist(), [0] * len(cols))
        toks, ok = d.tolist(), valid.tolist()
        rows = shape if isinstance(shape, list) else [shape] * len(active)
        for b, a in enumerate(active):
            if a:
                self._commit_path(b, paths[b], nxt[b], toks[b], ok[b], rows[b])
        sync(self.device)
        self.counts.verify_time_s += time.perf_counter() - t0
        self.round += 1
        self._notify()

    def _commit_path(self, b: int, path: list[int], nxt: int, toks: list[int], ok: list[bool],
                     tree: DraftTree | None) -> None:
        emitted = self._emit(b, [toks[c] for c in path] + [nxt])
        accepted = min(len(emitted), len(path))
        stopped_early = self.reasons[b] == "stop" and len(emitted) <= len(path)
        end = path[-1] if path else -1
        more = tree is not None and any(ok[c] for c in tree.children[end])  # a child of the last node was judged
        rejected_at = len(path) if more and not stopped_early else None
        self.counts.record_row(drafted=sum(ok), accepted=accepted, committed=len(emitted), rejected_at=rejected_at)
