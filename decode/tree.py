"""Static draft trees: the shape of a tree of draft tokens verified in ONE target forward.

A tree generalises a chain: at each depth the drafter may offer several alternatives (its top-k
tokens), and the target scores all of them at once under a tree attention mask (each node sees the
committed context, its ancestors and itself). The longest path the target agrees with is accepted.
This is the static-tree scheme of SpecInfer (Miao et al. 2024), Medusa (Cai et al. 2024) and EAGLE-1
(Li et al. 2024); the node list format is Medusa's "choices": each node is the path of child ranks
from the root, e.g. ``(0,)`` is the drafter's best first token, ``(1,)`` its second best, ``(0, 2)``
the third-best token after the best first one.

Node order is the verification order: node ``i`` (0-based) is column ``i + 1`` of the verification
pass (column 0 is the last committed token, the root). Parents always precede their children.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: The largest tree accepted: every node is scored in one target forward.
MAX_NODES = 1024


@dataclass(frozen=True)
class DraftTree:
    """A static draft tree. Build it with :meth:`parse`.

    Attributes:
        paths: per node, its path of child ranks from the root (length = depth >= 1).
        parents: per node, the index of its parent node, ``-1`` for children of the root.
        depths: per node, its depth (1 = first draft position).
        ranks: per node, its rank among the drafter's candidates after its parent (0 = best).
        children: per node index, and ``-1`` for the root, the child node indices in rank order.
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...] = field(init=False)
    depths: tuple[int, ...] = field(init=False)
    ranks: tuple[int, ...] = field(init=False)
    children: dict[int, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        index = {p: i for i, p in enumerate(self.paths)}
        parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in self.paths)
        kids: dict[int, list[int]] = {-1: []}
        for i, par in enumerate(parents):
            kids.setdefault(par, []).append(i)
            kids.setdefault(i, [])
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depths", tuple(len(p) for p in self.paths))
        object.__setattr__(self, "ranks", tuple(p[-1] for p in self.paths))
        object.__setattr__(self, "children", {k: tuple(sorted(v, key=lambda c: self.paths[c][-1]))
                                              for k, v in kids.items()})

    # --- construction --------------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: Any) -> DraftTree:
        """Build a tree from ``spec``:

        * a :class:`DraftTree` (returned as is);
        * a string of branching factors per depth, ``"3,2,1"``: the 3 best first tokens, the 2 best
          after each of them, the best after each of those (3 + 6 + 6 = 15 nodes);
        * a JSON list of paths (``"[[0], [1], [0, 0]]"``) or a Python list of paths (Medusa "choices").

        Paths are sorted by depth, then lexicographically; duplicates are removed.

        Raises:
            ValueError: an empty tree, a negative rank or factor, a path whose parent path is missing, or
                a node of rank r > 0 without its sibling of rank r - 1.
        """
        if isinstance(spec, DraftTree):
            return spec
        if isinstance(spec, str):
            text = spec.strip()
            if text.startswith("["):
                try:
                    spec = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"tree {spec!r} is not valid JSON ({e}); give a list of paths such as "
                                     "[[0], [1], [0, 0]] or branching factors such as '3,2,1'") from None
            else:
                try:
                    widths = [int(w) for w in text.split(",")]
                except ValueError:
                    raise ValueError(f"tree {spec!r}: give branching factors per depth such as '3,2,1' or a "
                                     "JSON list of paths such as [[0], [1], [0, 0]]") from None
                return cls.from_widths(widths)
        if not isinstance(spec, Sequence) or not all(isinstance(p, Sequence) and not isinstance(p, str)
                                                     for p in spec):
            raise ValueError(f"tree must be a DraftTree, a string such as '3,2,1', or a list of paths, each a "
                             f"list of ranks, such as [[0], [1], [0, 0]]; got {spec!r}")
        if any(isinstance(r, bool) or not isinstance(r, (int,)) and not (hasattr(r, "__index__"))
               for p in spec for r in p):
            raise ValueError(f"tree paths must hold integer ranks (0 = the drafter's best token), e.g. "
                             f"[[0], [1], [0, 0]]; got {spec!r}")
        paths = sorted({tuple(int(r) for r in p) for p in spec}, key=lambda p: (len(p), p))
        if not paths or any(len(p) == 0 for p in paths):
            raise ValueError("a draft tree needs at least one node and every path at least one rank "
                             "(e.g. [[0], [1], [0, 0]])")
        if any(r < 0 for p in paths for r in p):
            raise ValueError(f"tree ranks must be >= 0 (0 = the drafter's best token); got {paths}")
        have = set(paths)
        orphans = [list(p) for p in paths if len(p) > 1 and p[:-1] not in have]
        if orphans:
            raise ValueError(f"tree paths {orphans[:3]} have no parent node: every prefix of a path must be a "
                             "node too (e.g. [0, 1] needs [0])")
        gaps = [list(p) for p in paths if p[-1] > 0 and (*p[:-1], p[-1] - 1) not in have]
        if gaps:
            raise ValueError(f"tree paths {gaps[:3]} skip a better-ranked sibling: a node of rank r drafts the "
                             "drafter's r-th best token there, so ranks 0..r-1 must be nodes too (e.g. [1] needs "
                             "[0], [0, 2] needs [0, 1])")
        return cls._sized(tuple(paths))

    @classmethod
    def _sized(cls, paths: tuple[tuple[int, ...], ...]) -> DraftTree:
        if len(paths) > MAX_NODES:
            raise ValueError(f"a draft tree of {len(paths)} nodes is too big: one verification pass would score "
                             f"them all; use at most {MAX_NODES} nodes (e.g. '3,2,1' has 15, EAGLE's default "
                             "trees have ~60)")
        return cls(paths)

    @classmethod
    def from_widths(cls, widths: Sequence[int]) -> DraftTree:
        """The full tree with ``widths[d]`` children per node at depth ``d`` (see :meth:`parse`).

        Raises:
            ValueError: no widths or a width < 1.
        """
        widths = list(widths)
        if not widths or any(w < 1 for w in widths):
            raise ValueError(f"tree branching factors must be >= 1 per depth (e.g. '3,2,1'); got {widths}")
        size, level = 0, 1
        for w in widths:
            level *= w
            size += level
        if size > MAX_NODES:
            return cls._sized(((0,),) * size)  # raises with the size
        paths = [p for d in range(1, len(widths) + 1) for p in itertools.product(*(range(w) for w in widths[:d]))]
        return cls(tuple(paths))

    @classmethod
    def chain(cls, k: int) -> DraftTree:
        """A chain of ``k`` nodes (the drafter's best token at every depth)."""
        return cls.from_widths([1] * k)

    # --- queries -------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def spine(self) -> list[int]:
        """Node indices of the rank-0 path ``(0,), (0, 0), ...`` as deep as the tree has it."""
        index = {p: i for i, p in enumerate(self.paths)}
        out, d = [], 1
        while (0,) * d in index:
            out.append(index[(0,) * d])
            d += 1
        return out

    def attention_mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool ``[N + 1, N + 1]`` over ``[root, node_0 .. node_{N-1}]``: entry ``[i, j]`` is True iff
        column ``j`` is column ``i`` or one of its ancestors (the root is everyone's ancestor)."""
        return _attention_mask(self).to(device, copy=True)

    def subtree(self, keep: Sequence[bool]) -> tuple[DraftTree, list[int]]:
        """The tree of the nodes with ``keep[i]`` True (each kept node's parent must be kept) and the
        old index of each new node. Ranks keep their meaning (the paths are unchanged).

        Raises:
            ValueError: a kept node's parent is not kept, or nothing is kept.
        """
        sub, idx = _subtree(self, tuple(bool(k) for k in keep))
        return sub, list(idx)

    def levels(self) -> tuple[tuple[int, ...], ...]:
        """Node indices by depth: ``levels()[d - 1]`` holds the nodes at depth ``d``."""
        return _levels(self)

    def __len__(self) -> int:
        return self.num_nodes

    def __str__(self) -> str:
        return f"DraftTree({self.num_nodes} nodes, depth {self.max_depth})"


# Per-tree results cached: a decode loop asks for the same tree's mask and the same pruned subtrees
# every round.

@functools.lru_cache(maxsize=64)
def _attention_mask(tree: DraftTree) -> torch.Tensor:
    n = tree.num_nodes
    m = torch.eye(n + 1, dtype=torch.bool)
    m[:, 0] = True
    for i in range(n):
        m[i + 1] |= m[tree.parents[i] + 1]
    return m


@functools.lru_cache(maxsize=1024)
def _subtree(tree: DraftTree, keep: tuple[bool, ...]) -> tuple[DraftTree, tuple[int, ...]]:
    idx = [i for i, k in enumerate(keep) if k]
    bad = [i for i in idx if tree.parents[i] >= 0 and not keep[tree.parents[i]]]
    if bad or not idx:
        raise ValueError(f"subtree needs a non-empty set closed under parents; nodes {bad[:3]} lack theirs")
    return DraftTree(tuple(tree.paths[i] for i in idx)), tuple(idx)


@functools.lru_cache(maxsize=64)
def _levels(tree: DraftTree) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(i for i, d in enumerate(tree.depths) if d == depth) for depth in range(1, tree.max_depth + 1))


def close_under_parents(tree: DraftTree, valid: torch.Tensor) -> torch.Tensor:
    """``valid [B, N]`` bool -> the same with every node whose parent is invalid set invalid (a node can
    only be accepted after its parent). One vectorised step per depth."""
    valid = valid.clone()
    for level in tree.levels()[1:]:
        idx = torch.tensor(level, device=valid.device)
        par = torch.tensor([tree.parents[i] for i in level], device=valid.device)
        valid[:, idx] &= valid[:, par]
    return valid


def level_mask(tree: DraftTree | Sequence[int], nodes: Sequence[int], col: dict[int, int],
               width: int | None = None) -> torch.Tensor:
    """Tree attention for one level of drafting: bool ``[m, len(col) + m]``. ``nodes`` are the ``m`` nodes
    run now, appended after the ``len(col)`` tree entries already in the drafter's cache (``col``: node
    -> its column among them); row ``j`` is True at the columns of ``nodes[j]``'s ancestors and its own.
    ``tree`` is a :class:`DraftTree` or the parent index of every node (a dynamic tree being grown);
    ``width`` (default ``len(col)``) is the number of tree entries already in the cache when it holds
    padding columns besides ``col``'s."""
    parents = tree.parents if isinstance(tree, DraftTree) else tree
    ntree, m = (len(col) if width is None else width), len(nodes)
    rows = []
    for j, i in enumerate(nodes):
        row, a = [False] * (ntree + m), parents[i]
        while a >= 0:
            row[col[a]] = True
            a = parents[a]
        row[ntree + j] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)

