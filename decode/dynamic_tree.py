"""Dynamic draft trees (EAGLE-2: Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees"): the tree's shape is chosen per row and per round from the drafter's own
confidence instead of being fixed in advance.

Expansion: the root's ``topk`` best children are drafted; at each further depth the ``topk`` nodes of
the newest level with the highest cumulative draft log-probability (the sum of the log-probabilities of
the tokens on their path: the drafter's estimate of the chance the target accepts the whole path) get
``topk`` children each, through ONE drafter pass over those ``topk`` nodes under tree attention.
Reranking: after ``depth`` levels every drafted node is ranked by its cumulative log-probability and
the best ``total`` are verified (ties: the node drafted first). A child never scores above its parent,
so the kept set holds every kept node's ancestors.

The tree a row drafted is returned as a :class:`decode.tree.DraftTree` (its paths are the ranks each
node had among its parent's candidates), so verification is the static trees' machinery unchanged
(greedy, and exact sampling by rank-ordered one-hot rejection: the candidates are a deterministic
function of the committed tokens).

Spelling: ``"dynamic"`` or ``"dynamic:TOTAL[:DEPTH[:TOPK]]"`` (``decode.generate(tree=...)``,
``drafterkit eval --tree``); :func:`parse_tree` reads static and dynamic specs alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from drafterkit.decode.protocol import Proposal
from drafterkit.decode.tree import MAX_NODES, DraftTree

#: ``"dynamic"`` alone: sized for verification on a CPU, where every verified node costs target
#: compute (the quickstart's static tree ``3,2,1,1,1`` has 27 nodes and depth 5); EAGLE-2's GPU
#: setting is 60 nodes, depth 6, top-10.
DEFAULT_TOTAL, DEFAULT_DEPTH, DEFAULT_TOPK = 24, 5, 4
PREFIX = "dynamic"


@dataclass(frozen=True)
class DynamicTree:
    """An EAGLE-2 dynamic tree setting. Build it with :meth:`parse` or directly.

    Attributes:
        total: nodes verified per row and round (the budget after reranking), ``1..MAX_NODES``.
        depth: drafting levels (the deepest node), ``>= 1``; one drafter pass per level after the first.
        topk: children drafted per expanded node, and nodes expanded per level, ``>= 1``.

    Raises:
        ValueError: a field that is not an int in its range (the message names it and the fix).
    """

    total: int = DEFAULT_TOTAL
    depth: int = DEFAULT_DEPTH
    topk: int = DEFAULT_TOPK

    def __post_init__(self):
        for name, hi in (("total", MAX_NODES), ("depth", MAX_NODES), ("topk", MAX_NODES)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ValueError(f"dynamic tree {name} must be an int in [1, {hi}], got {v!r}; spell the tree "
                                 f"dynamic:TOTAL[:DEPTH[:TOPK]], e.g. dynamic:{DEFAULT_TOTAL}:{DEFAULT_DEPTH}:"
                                 f"{DEFAULT_TOPK}")

    @classmethod
    def parse(cls, spec: Any) -> DynamicTree:
        """``"dynamic"`` (the defaults) or ``"dynamic:TOTAL[:DEPTH[:TOPK]]"``; a :class:`DynamicTree` is
        returned as is.

        Raises:
            ValueError: another prefix, a field that is not a positive int, or more than three fields.
        """
        if isinstance(spec, DynamicTree):
            return spec
        text = str(spec).strip()
        head, _, rest = text.partition(":")
        fields = rest.split(":") if rest else []
        if head != PREFIX or len(fields) > 3 or (rest == "" and ":" in text):
            raise ValueError(f"dynamic tree {spec!r}: spell it dynamic or dynamic:TOTAL[:DEPTH[:TOPK]] (e.g. "
                             f"dynamic:{DEFAULT_TOTAL}:{DEFAULT_DEPTH}:{DEFAULT_TOPK}: {DEFAULT_TOTAL} nodes "
                             f"verified, {DEFAULT_DEPTH} levels, top-{DEFAULT_TOPK} expansion)")
        try:
            values = [int(f) for f in fields]
        except ValueError:
            raise ValueError(f"dynamic tree {spec!r}: TOTAL, DEPTH and TOPK must be integers, e.g. "
                             f"dynamic:{DEFAULT_TOTAL}:{DEFAULT_DEPTH}:{DEFAULT_TOPK}") from None
        return cls(*values)

    @property
    def max_depth(self) -> int:
        return self.depth

    def capped(self, depth: int) -> DynamicTree:
        """The same setting drafting at most ``depth`` (>= 1) levels."""
        return replace(self, depth=max(1, min(self.depth, int(depth))))

    def __str__(self) -> str:
        return f"{PREFIX}:{self.total}:{self.depth}:{self.topk}"


def is_dynamic(spec: Any) -> bool:
    """True for a :class:`DynamicTree` or a string starting with ``"dynamic"``."""
    return isinstance(spec, DynamicTree) or (isinstance(spec, str) and spec.strip().startswith(PREFIX))


def parse_tree(spec: Any) -> DraftTree | DynamicTree:
    """A static tree (anything :meth:`DraftTree.parse` takes) or a dynamic one (``"dynamic..."``).

    Raises:
        ValueError: a malformed spec of either kind.
    """
    return DynamicTree.parse(spec) if is_dynamic(spec) else DraftTree.parse(spec)


# --------------------------------------------------------------------------------------------------
# building one row's tree


@dataclass
class RowTree:
    """One row's drafted tree: ``tree`` (None: nothing drafted), ``tokens`` and ``scores`` (cumulative
    draft log-probabilities) per node in the tree's node order."""

    tree: DraftTree | None
    tokens: list[int]
    scores: list[float]


def ranked_tree(parents: Sequence[int], tokens: Sequence[int], scores: Sequence[float], total: int,
                ranks: Sequence[int] | None = None) -> RowTree:
    """Keep the ``total`` best of a drafted token tree and give it the DraftTree form.

    Args:
        parents: per node, its parent's index (``-1``: a child of the root); parents precede children.
        tokens, scores: per node, its token id and a score no greater than its parent's (e.g. the
            cumulative draft log-probability).
        total: the most nodes kept (the best by score; ties: the lower index).
        ranks: per node, its rank among its parent's candidates (unique among siblings); default: the
            order of the siblings by score.

    Returns:
        :class:`RowTree` in the tree's node order (by depth, then path).

    Raises:
        ValueError: a kept node whose parent is not kept (the scores are not monotone along paths).
    """
    n = len(parents)
    keep = sorted(sorted(range(n), key=lambda i: (-scores[i], i))[:total])
    kept = set(keep)
    if any(parents[i] >= 0 and parents[i] not in kept for i in keep):
        raise ValueError("ranked_tree: a node scores above its parent; scores must not increase along a path")
    if ranks is None:
        siblings: dict[int, list[int]] = {}
        for i in keep:
            siblings.setdefault(parents[i], []).append(i)
        rank = {i: r for kids in siblings.values() for r, i in enumerate(sorted(kids, key=lambda i: (-scores[i], i)))}
    else:
        rank = {i: ranks[i] for i in keep}
    path: dict[int, tuple[int, ...]] = {-1: ()}
    for i in keep:  # parents precede children
        path[i] = path[parents[i]] + (rank[i],)
    order = sorted(keep, key=lambda i: (len(path[i]), path[i]))
    if not order:
        return RowTree(None, [], [])
    return RowTree(DraftTree(tuple(path[i] for i in order)), [tokens[i] for i in order], [scores[i] for i in order])


class TreeBuilder:
    """Grows one row's EAGLE-2 tree; the drafter supplies the distributions.

    Usage (``logp`` rows are log-probabilities over the drafter's vocabulary, ``-inf`` at ids it may
    not propose)::

        b = TreeBuilder(spec, min_prob=drafter.draft_threshold, expand_prob=drafter.expand_bar)
        frontier = b.add_children(logp_root[None])          # [1, V]: the root's distribution
        while frontier:                                      # node ids to run the drafter on
            frontier = b.add_children(logp_of(frontier))     # [len(frontier), V]
        row = b.result()                                     # RowTree: the best ``total`` nodes

    ``min_prob``: a candidate whose path probability (``exp`` of its score) is below it is not drafted
    (the confidence threshold of static trees); ``expand_prob``: a node below it is not expanded.
    """

    def __init__(self, spec: DynamicTree, min_prob: float = 0.0, expand_prob: float = 0.0):
        self.spec = spec
        self.parents: list[int] = []
        self.tokens: list[int] = []
        self.scores: list[float] = []
        self.ranks: list[int] = []
        self.depths: list[int] = []
        self.frontier: list[int] = [-1]
        self.level = 0
        self._min = math.log(min_prob) if min_prob > 0 else -math.inf
        self._expand = max(self._min, math.log(expand_prob) if expand_prob > 0 else -math.inf)

    def add_children(self, logp: torch.Tensor, ids: torch.Tensor | None = None) -> list[int]:
        """Draft the ``topk`` children of each frontier node from ``logp [len(frontier), V']`` (``ids
        [V']``: the vocabulary id of each column, None = the column index); return the next frontier:
        the ``topk`` best new nodes that clear ``expand_prob``, or ``[]`` at the last level.

        Raises:
            ValueError: ``logp`` has not one row per frontier node.
        """
        if logp.dim() != 2 or logp.shape[0] != len(self.frontier):
            raise ValueError(f"add_children needs logp [{len(self.frontier)}, V] (one row per frontier node), "
                             f"got {tuple(logp.shape)}")
        k = min(self.spec.topk, logp.shape[-1])
        vals, idx = logp.float().topk(k, -1)
        toks = (idx if ids is None else ids.to(idx.device)[idx]).tolist()
        vals = vals.tolist()
        self.level += 1
        new = []
        for pi, par in enumerate(self.frontier):
            base = 0.0 if par < 0 else self.scores[par]
            for r in range(k):
                s = base + vals[pi][r]
                if not s >= self._min or vals[pi][r] == -math.inf:  # also drops NaN
                    continue
                new.append(len(self.parents))
                self.parents.append(par)
                self.tokens.append(int(toks[pi][r]))
                self.scores.append(s)
                self.ranks.append(r)
                self.depths.append(self.level)
        grow = [i for i in new if self.scores[i] >= self._expand]
        if self.level >= self.spec.depth or not grow:
            self.frontier = []
        else:
            self.frontier = sorted(grow, key=lambda i: (-self.scores[i], i))[: self.spec.topk]
        return self.frontier

    def result(self) -> RowTree:
        """The best ``total`` drafted nodes (:func:`ranked_tree` with the drafter's ranks)."""
        return ranked_tree(self.parents, self.tokens, self.scores, self.spec.total, self.ranks)


def pack_rows(rows: Sequence[RowTree | None]) -> Proposal:
    """Per-row trees -> a dynamic tree :class:`Proposal`: ``tokens [B, N]``, ``mask [B, N]`` (True on
    each row's own nodes), ``scores [B, N]`` and ``trees`` (N = the largest row tree; a row with none
    proposes nothing)."""
    n = max([len(r.tokens) for r in rows if r is not None] + [1])
    b = len(rows)
    tokens = torch.zeros(b, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    scores = torch.full((b, n), -math.inf)
    trees: list[DraftTree | None] = []
    for i, r in enumerate(rows):
        if r is None or r.tree is None:
            trees.append(None)
            continue
        m = len(r.tokens)
        tokens[i, :m] = torch.tensor(r.tokens, dtype=torch.long)
        mask[i, :m] = True
        scores[i, :m] = torch.tensor(r.scores)
        trees.append(r.tree)
    return Proposal(tokens=tokens, probs=None, mask=mask, trees=trees, scores=scores)


def row_tree_of(prop: Proposal, b: int) -> RowTree | None:
    """Row ``b`` of a dynamic tree proposal as a :class:`RowTree` (None when it proposes nothing)."""
    tree = prop.trees[b] if prop.trees is not None else None
    if tree is None:
        return None
    n = tree.num_nodes
    scores = prop.scores[b, :n].tolist() if prop.scores is not None else [0.0] * n
    return RowTree(tree, prop.tokens[b, :n].tolist(), scores)


def merge_scored(rows: Sequence[RowTree | None], paths: dict[tuple[int, ...], float], total: int) -> RowTree:
    """One token tree from a drafted row tree and extra token paths (``{token path: score}``, every
    prefix of a path present, scores monotone along paths, e.g. the log share of retrieval matches
    agreeing with the path): a path both hold keeps the higher score; the best ``total`` nodes of the
    union are kept (:func:`ranked_tree`, sibling ranks by score)."""
    union: dict[tuple[int, ...], float] = {}
    for row in rows:
        if row is None or row.tree is None:
            continue
        tok_path: dict[int, tuple[int, ...]] = {-1: ()}
        for i, (par, t) in enumerate(zip(row.tree.parents, row.tokens)):
            tok_path[i] = tok_path[par] + (t,)
            union[tok_path[i]] = max(union.get(tok_path[i], -math.inf), row.scores[i])
    for p, s in paths.items():
        union[p] = max(union.get(p, -math.inf), s)
    order = sorted(union, key=lambda p: (len(p), -union[p]))
    index = {p: i for i, p in enumerate(order)}
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in order]
    return ranked_tree(parents, [p[-1] for p in order], [union[p] for p in order], total)
