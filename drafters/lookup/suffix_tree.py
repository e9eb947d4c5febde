"""Suffix trees for suffix decoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", arXiv 2411.04975; the algorithm of Snowflake's Arctic Inference
``SuffixDecodingCache``, which vLLM's ``suffix`` speculative method runs).

A suffix tree of depth ``D`` over token sequences holds every substring of at most ``D`` tokens of each
sequence (substrings never cross from one sequence into another), each node with its **count**: how many
times its path occurs. A node's child ``t`` has the estimated probability ``count(path + t) / count(path)``
of following it (the count of a path includes the occurrences that end a sequence, so the children's
probabilities may sum to less than 1).

Proposing (:func:`speculate`): for each match length ``m = 1, 2, ...`` (up to ``D - 1``) the row's last
``m`` tokens are looked up; from the node reached, the draft follows the most frequent child while the
product of the probabilities along the draft (each draft token's estimated probability) stays at or above
``min_token_prob``, for at most ``min(max_spec_tokens, floor(m * max_spec_factor + max_spec_offset))``
tokens: a longer match earns a longer draft (the paper's ``MAX_SPEC = alpha * p``). A draft's score is the
sum of its tokens' probabilities (its expected number of accepted tokens); the best-scoring match length
wins (ties: the longer match). The looked-up path stops at the first ``m`` that does not occur.

Two structures give the same node interface (``match``, ``count``, ``children``):

* :class:`SuffixTree`: a trie in Python dictionaries, grown incrementally as tokens are appended (each token
  extends the at most ``D`` open suffixes of its sequence: ``O(D)`` dictionary steps per token), with
  sequences removable (the global cache's FIFO eviction). Used per request (prompt + committed tokens) and
  for the outputs produced in the same run.
* :class:`CorpusSuffixIndex`: a suffix array over a large static corpus (ShareGPT's assistant turns, the
  datastore's token streams), sorted by each suffix's first ``D`` tokens with numpy (prefix doubling); a
  node is the range of suffixes starting with its path, found by binary search (every suffix of the context
  at once, vectorised with numpy). Siblings are counted over the range, or over ``max_scan`` evenly spaced
  suffixes of it when it is larger (a stratified estimate of the ranking; the counts of the path drafted are
  exact: the suffixes of a node's range are sorted by their next token, so each child's range comes from one
  vectorised binary search over that column). A node's children are kept for later rounds (the corpus is
  static), for the last ``cache_nodes`` nodes.

Sibling order: higher count first; among equal counts, the child whose first occurrence came first (for a
trie: the first appended; for a corpus: the lowest corpus position). Arctic Inference orders equal counts
by the history of its sibling lists instead, so the two can draft different tokens where counts tie.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SEPARATOR = -1  # between documents of a corpus (drafters.lookup.datastore.SEPARATOR)


@dataclass
class Draft:
    """One suffix-tree proposal: ``tokens`` (the draft, a path), ``probs`` (each token's estimated
    probability: the product of the count ratios along the path, float32 as Arctic Inference computes
    them), ``score`` (their sum: the expected accepted tokens), ``match_len`` (the matched context length),
    ``node`` (the source's node the draft starts from; for trees) and ``source`` (which tree)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    node: Any = None
    source: Any = None


class _Node:
    __slots__ = ("children", "count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.first: dict[int, int] = {}  # sequence id -> clock of this path's first occurrence in it


class SuffixTree:
    """Incremental suffix trie of depth ``max_depth`` over one or more token sequences (see the module
    docstring). ``append`` / ``extend`` add tokens to a sequence (created on first use), ``remove`` drops a
    sequence and every count it contributed.

    Raises:
        ValueError: ``max_depth < 1``; ``remove`` of an unknown sequence.
    """

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"SuffixTree needs max_depth >= 1, got {max_depth}")
        self.max_depth = int(max_depth)
        self.root = _Node()
        self._seqs: dict[int, list[int]] = {}
        self._open: dict[int, deque] = {}  # per sequence: the nodes its last (< max_depth) suffixes reached
        self._clock = 0  # appended tokens so far: orders first occurrences

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    @property
    def sequences(self) -> list[int]:
        """Ids of the sequences held, in the order they were created."""
        return list(self._seqs)

    def tokens_of(self, seq_id: int) -> list[int]:
        return self._seqs[seq_id]

    def extend(self, seq_id: int, tokens) -> None:
        """Append ``tokens`` to sequence ``seq_id``: each opens a new suffix at the root and extends the
        sequence's open suffixes by one token (those reaching ``max_depth`` tokens are closed)."""
        seq = self._seqs.setdefault(seq_id, [])
        open_nodes = self._open.setdefault(seq_id, deque())
        root, depth = self.root, self.max_depth
        for t in tokens:
            t = int(t)
            open_nodes.append(root)
            if len(open_nodes) > depth:
                open_nodes.popleft()
            root.count += 1
            clock = self._clock
            self._clock += 1
            seq.append(t)
            for i, node in enumerate(open_nodes):
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                child.count += 1
                if seq_id not in child.first:
                    child.first[seq_id] = clock
                open_nodes[i] = child

    def remove(self, seq_id: int) -> None:
        """Drop sequence ``seq_id``: every substring of it loses one count; paths left with none go."""
        if seq_id not in self._seqs:
            raise ValueError(f"SuffixTree: no sequence {seq_id}")
        seq = self._seqs.pop(seq_id)
        del self._open[seq_id]
        self.root.count -= len(seq)
        for j in range(len(seq)):
            node = self.root
            for t in seq[j: j + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                child.first.pop(seq_id, None)
                if child.count == 0:
                    del node.children[t]
                    break
                node = child

    # --- the node interface speculate() reads -------------------------------------------------------

    def match(self, pattern) -> _Node | None:
        """The node of path ``pattern`` (a token list), or None where it does not occur."""
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    @staticmethod
    def count(node: _Node) -> int:
        return node.count

    @staticmethod
    def children(node: _Node) -> list[tuple[int, int, Any]]:
        """``[(token, count, child node)]``, most frequent first (ties: first occurrence first)."""
        items = sorted(node.children.items(), key=lambda kv: (-kv[1].count, min(kv[1].first.values())))
        return [(t, c.count, c) for t, c in items]

    @staticmethod
    def head(node: _Node) -> tuple[int, int, Any] | None:
        """The first of :meth:`children` (or None), without sorting them all."""
        if not node.children:
            return None
        t, c = min(node.children.items(), key=lambda kv: (-kv[1].count, min(kv[1].first.values())))
        return t, c.count, c

    def paths(self) -> dict[tuple[int, ...], int]:
        """Every path held and its count (for tests and inspection)."""
        out, stack = {}, [((), self.root)]
        while stack:
            path, node = stack.pop()
            for t, c in node.children.items():
                out[path + (t,)] = c.count
                stack.append((path + (t,), c))
        return out


def suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions of every non-separator token of ``tokens`` (int32 ``[N]``, documents separated by
    :data:`SEPARATOR`), sorted by the suffix's first ``depth`` tokens (a separator or the end sorting before
    every token), ties by position: int64 ``[M]``. Prefix doubling with numpy sorts (``ceil(log2 depth)``
    rounds of one stable argsort each)."""
    n = tokens.size
    rank = tokens.astype(np.int64) + 2  # separator -> 1, the end (padding) -> 0
    h = 1
    while h < depth:
        nxt = np.zeros(n, dtype=np.int64)
        nxt[: max(n - h, 0)] = rank[h:]
        key = rank * (n + 3) + nxt
        order = np.argsort(key, kind="stable")
        sk = key[order]
        new = np.empty(n, dtype=np.int64)
        new[order] = np.concatenate([[2], 2 + np.cumsum(sk[1:] != sk[:-1])]) if n else []
        rank = np.where(tokens == SEPARATOR, 1, new)  # a suffix starting at a separator stays one symbol
        h *= 2
    order = np.argsort(rank, kind="stable")
    return order[tokens[order] != SEPARATOR].astype(np.int64)


class CorpusSuffixIndex:
    """A static suffix tree of depth ``max_depth`` over a corpus, as a suffix array (module docstring).

    Args:
        tokens: int32 ``[N]``, documents separated by :data:`SEPARATOR`.
        max_depth: the tree depth ``D`` (paths of at most ``D`` tokens).
        sa: a saved :func:`suffix_array` of ``tokens`` at this depth (computed when None).
        max_scan: siblings are counted over at most this many suffixes of a node's range (evenly spaced).

    Raises:
        ValueError: ``max_depth < 1`` or ``max_scan < 1``.
    """

    def __init__(self, tokens: np.ndarray, max_depth: int, sa: np.ndarray | None = None, max_scan: int = 1 << 16):
        if max_depth < 1 or max_scan < 1:
            raise ValueError(f"CorpusSuffixIndex needs max_depth >= 1 and max_scan >= 1, got {max_depth}, {max_scan}")
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.max_depth, self.max_scan = int(max_depth), int(max_scan)
        self.sa = suffix_array(tokens, max_depth) if sa is None else np.asarray(sa, dtype=np.int64)
        # padded so that a suffix's next D tokens can always be read (the end reads as a separator)
        self.tokens = np.concatenate([tokens, np.full(max_depth + 1, SEPARATOR, dtype=np.int32)])
        self.size = int(tokens.size)
        self.cache_nodes = 4096
        self._kids: dict[tuple[int, int, int], list] = {}  # node -> children(node), oldest first

    def _prefix(self, i: int, m: int) -> list[int]:
        s = int(self.sa[i])
        out = self.tokens[s: s + m].tolist()
        if SEPARATOR in out:
            out = out[: out.index(SEPARATOR)] + [SEPARATOR]
        return out

    def _bound(self, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
        m = len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            p = self._prefix(mid, m)
            if p < pattern or (upper and p == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def match(self, pattern) -> tuple[int, int, int] | None:
        """The node of path ``pattern``: ``(lo, hi, len)``, the suffix-array range of its occurrences."""
        pattern = [int(t) for t in pattern]
        lo = self._bound(pattern, 0, len(self.sa), False)
        hi = self._bound(pattern, lo, len(self.sa), True)
        return (lo, hi, len(pattern)) if hi > lo else None

    def match_suffixes(self, context) -> list:
        """The nodes of the last ``1, 2, .., len(context)`` tokens of ``context`` (at most ``max_depth``), as
        :meth:`match` finds them one by one, with one vectorised binary search over all of them (lower and
        upper bounds together): suffixes compare with the patterns over the first ``m`` tokens, where a
        separator (-1) sorts first as in the suffix array."""
        ctx = np.asarray([int(t) for t in context][-self.max_depth:], dtype=np.int64)
        n, d = ctx.size, self.max_depth
        if n == 0 or self.sa.size == 0:
            return []
        lens = np.arange(1, n + 1)
        pats = np.full((n, d), SEPARATOR, dtype=np.int64)
        for m in range(1, n + 1):
            pats[m - 1, :m] = ctx[n - m:]
        pats, lens = np.concatenate([pats, pats]), np.concatenate([lens, lens])
        upper = np.arange(2 * n) >= n
        cols = np.arange(d)
        within = cols[None, :] < lens[:, None]
        a, b = np.zeros(2 * n, dtype=np.int64), np.full(2 * n, self.sa.size, dtype=np.int64)
        rows_i = np.arange(2 * n)
        while True:
            live = a < b
            if not live.any():
                break
            mid = (a + b) // 2
            rows = self.tokens[self.sa[np.minimum(mid, self.sa.size - 1)][:, None] + cols[None, :]]
            diff = (rows != pats) & within
            first = diff.argmax(axis=1)
            same = ~diff.any(axis=1)
            less = ~same & (rows[rows_i, first] < pats[rows_i, first])
            right = live & (less | (upper & same))
            a = np.where(right, mid + 1, a)
            b = np.where(live & ~right, mid, b)
        return [(lo, hi, m) if hi > lo else None for m, lo, hi in zip(range(1, n + 1), a[:n].tolist(), a[n:].tolist())]

    @staticmethod
    def count(node) -> int:
        return node[1] - node[0]

    def _column(self, rows: np.ndarray, m: int) -> np.ndarray:
        """Token ``m`` of the suffixes at suffix-array rows ``rows`` (a separator or the end reads -1)."""
        return self.tokens[self.sa[rows] + m]

    def _child_ranges(self, lo: int, hi: int, m: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The suffix-array ranges ``[start, end)`` of the children ``tokens`` of node ``(lo, hi, m)``: int64
        ``[G]`` each. The node's suffixes share their first ``m`` tokens, so they are sorted by token ``m``
        (a separator, -1, first); one vectorised binary search over that column finds every child's bounds."""
        want = np.concatenate([tokens, tokens]).astype(np.int64)
        upper = np.arange(want.size) >= tokens.size  # first half: lower bounds (col >= t), second: col > t
        a, b = np.full(want.size, lo, dtype=np.int64), np.full(want.size, hi, dtype=np.int64)
        while True:
            live = a < b
            if not live.any():
                break
            mid = (a + b) // 2
            col = self._column(np.minimum(mid, hi - 1), m).astype(np.int64)
            right = live & ((col < want) | (upper & (col == want)))
            a = np.where(right, mid + 1, a)
            b = np.where(live & ~right, mid, b)
        return a[: tokens.size], a[tokens.size:]

    def children(self, node) -> list[tuple[int, int, Any]]:
        """``[(token, count, child node)]``, most frequent first (ties: lowest corpus position first); over a
        range larger than ``max_scan`` the order is estimated from evenly spaced suffixes, the counts exact.
        Results are kept (the corpus is static) for the last ``cache_nodes`` nodes asked."""
        kids = self._kids.get(node)
        if kids is None:
            kids = self._kids[node] = self._children(*node)
            if len(self._kids) > self.cache_nodes:
                del self._kids[next(iter(self._kids))]  # the oldest entry
        return kids

    def _children(self, lo: int, hi: int, m: int) -> list[tuple[int, int, Any]]:
        if m >= self.max_depth:
            return []
        total = hi - lo
        exact = total <= self.max_scan
        idx = np.arange(lo, hi) if exact else lo + (np.arange(self.max_scan) * total) // self.max_scan
        starts = self.sa[idx]
        col = self.tokens[starts + m]
        keep = col != SEPARATOR
        col, starts, idx = col[keep], starts[keep], idx[keep]
        if col.size == 0:
            return []
        cut = np.flatnonzero(col[1:] != col[:-1]) + 1
        bounds = np.concatenate([[0], cut, [col.size]])
        sizes = np.diff(bounds)
        firsts = np.minimum.reduceat(starts, bounds[:-1])
        order = np.lexsort((firsts, -sizes))
        toks = col[bounds[:-1][order]]
        if exact:  # the scan covered the whole range: its groups are the children's ranges
            a, b = idx[bounds[:-1][order]], idx[bounds[1:][order] - 1] + 1
        else:  # the counts stay exact: each child's range from a binary search over the node's range
            a, b = self._child_ranges(lo, hi, m, toks)
        return [(t, e - s, (s, e, m + 1)) for t, s, e in zip(toks.tolist(), a.tolist(), b.tolist())]

    def head(self, node):
        kids = self.children(node)
        return kids[0] if kids else None


def max_draft(match_len: int, max_spec_tokens: int, factor: float, offset: float) -> int:
    """The most tokens a match of ``match_len`` may draft: ``min(max_spec_tokens, floor(match_len * factor +
    offset))``, at least 0 (Arctic Inference's rule, float32 as it computes it)."""
    grant = float(np.float32(match_len) * np.float32(factor) + np.float32(offset)) + 1e-6
    return max(0, min(int(max_spec_tokens), int(grant)))


def _path(src, node, n_max: int, min_prob: np.float32) -> Draft:
    """The most frequent path from ``node``: at most ``n_max`` tokens, each with probability >= ``min_prob``."""
    d, prob = Draft(), np.float32(1.0)
    score = np.float32(0.0)
    while len(d.tokens) < n_max:
        top = src.head(node)
        if top is None:
            break
        token, count, child = top
        parent_count = src.count(node)
        if count != parent_count:  # along an unbranched stretch the probability stays as it was
            prob = np.float32(prob * np.float32(np.float32(count) / np.float32(parent_count)))
        if prob < min_prob:
            break
        d.tokens.append(token)
        d.probs.append(float(prob))
        score = np.float32(score + prob)
        node = child
    d.score = float(score)
    return d


def speculate(src, context, max_spec_tokens: int, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
              min_token_prob: float = 0.1) -> Draft:
    """The best chain draft of ``src`` (a :class:`SuffixTree` or :class:`CorpusSuffixIndex`) after
    ``context`` (token ids; only its last ``src.max_depth`` are read), as the module docstring describes:
    match lengths ``1 .. min(len(context), D) - 1``, the best score wins (ties: the longer match).
    Returns an empty :class:`Draft` (``match_len`` 0) when even the last token never occurred."""
    context = list(context)[-src.max_depth:]
    best, min_prob = Draft(), np.float32(min_token_prob)
    nodes = src.match_suffixes(context[1:]) if hasattr(src, "match_suffixes") else None
    for m in range(1, len(context)):
        node = src.match(context[-m:]) if nodes is None else nodes[m - 1]
        if node is None:
            break
        d = _path(src, node, max_draft(m, max_spec_tokens, max_spec_factor, max_spec_offset), min_prob)
        if d.score >= best.score:
            best = d
            best.match_len, best.node, best.source = m, node, src
    return best


def branch_paths(src, node, depth: int, min_prob: float, limit: int) -> dict[tuple[int, ...], float]:
    """The draft tree under ``node``: up to ``limit`` paths of at most ``depth`` tokens, best first by
    estimated probability (the product of count ratios, as :func:`speculate`), each path's probability
    >= ``min_prob``; every prefix of a kept path is kept. Returns ``{token path: probability}``."""
    out: dict[tuple[int, ...], float] = {}
    frontier = [(1.0, (), node)]
    while frontier and len(out) < limit:
        frontier.sort(key=lambda x: -x[0])  # stable: among equal probabilities, the earlier (higher-ranked)
        prob, path, nd = frontier.pop(0)
        if path:
            out[path] = prob
        if len(path) >= depth:
            continue
        parent_count = src.count(nd)
        for token, count, child in src.children(nd):
            p = prob if count == parent_count else prob * count / parent_count
            if p < min_prob:
                break
            frontier.append((p, path + (token,), child))
    return out


__all__ = ["CorpusSuffixIndex", "Draft", "SuffixTree", "branch_paths", "max_draft", "speculate", "suffix_array"]
