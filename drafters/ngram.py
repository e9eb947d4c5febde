"""N-gram / prompt-lookup proposer (Saxena 2023, "Prompt Lookup Decoding"; Yang et al. 2023, LLMA).

Match the last ``n`` tokens of a row (``n`` from ``max_ngram`` down to ``min_ngram``: the longest that
occurred before wins) against the row's own earlier tokens (prompt + output); the EARLIEST occurrence of
that n-gram wins and up to ``k`` tokens that followed it are proposed. This is vLLM's ``ngram`` method
(``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``) and
transformers' prompt lookup (``PromptLookupCandidateGenerator``, left to right): the earliest occurrence
has the most tokens after it, so in a repetition loop of period ``p < k`` it still drafts ``k`` tokens
where the most recent one would stop at the end of the row after ``p``. No weights, deterministic
(``probs=None``: one-hot q, still exact under sampling). When nothing matches it proposes nothing for
that row (the round is a plain target step for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drafterkit.decode.dynamic_tree import DynamicTree, merge_scored, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.base import Drafter


@dataclass
class NGramConfig:
    """``max_ngram`` >= ``min_ngram`` >= 1: n-gram sizes tried, longest first."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"NGramConfig needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
                             f"max_ngram={self.max_ngram}")


def lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the EARLIEST earlier occurrence of the row's last n-gram, for the
    longest ``n`` in ``[min_ngram, max_ngram]`` that occurred before (vLLM's ``ngram`` method and
    transformers' prompt lookup pick the same occurrence; an occurrence counts when at least one token
    follows it, so it may overlap the row's own suffix, as in ``a a a``).

    Returns the continuation found (between 1 and ``k`` ids, fewer than ``k`` only where the row ends
    first), or ``[]`` when nothing matches: the proposer then proposes nothing for that row, and a round
    where no row has a match costs one plain target step instead of a K+1-token verification of guesses.
    """
    n = len(tokens)
    for g in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        pattern = tokens[n - g:]
        first = pattern[0]
        for j in range(n - g):  # left to right: the earliest occurrence, with >= 1 token after it
            if tokens[j] == first and tokens[j: j + g] == pattern:
                return tokens[j + g: j + g + k]
    return []


def continuations(tokens: list[int], depth: int, max_ngram: int, min_ngram: int,
                  max_matches: int = 64) -> list[list[int]]:
    """What followed EVERY earlier occurrence of the row's last n-gram (longest n first, as
    :func:`lookup`): up to ``max_matches`` continuations of up to ``depth`` tokens, most recent first (the
    trie's tie-break: recency); ``[]`` when nothing matches. With at most ``max_matches`` occurrences the
    last one is :func:`lookup`'s (the earliest occurrence)."""
    n = len(tokens)
    for g in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        pattern = tokens[n - g:]
        first = pattern[0]
        found = [tokens[j + g: j + g + depth] for j in range(n - g - 1, -1, -1)
                 if tokens[j] == first and tokens[j: j + g] == pattern]
        if found:
            return found[:max_matches]
    return []


def fill_tree(tree, conts: list[list[int]]) -> tuple[list[int], list[bool]]:
    """Map continuations onto an empty draft tree: node ``(r1, r2, ..)`` gets the ``r1``-th most frequent
    first token among ``conts``, then the ``r2``-th most frequent next token among the continuations
    that start so, and so on (ties: earlier in ``conts`` first), i.e. a frequency-ranked trie of what
    followed the matched n-gram (the continuation tree of SuffixDecoding, Oliaro et al. 2024). With one
    continuation this is prompt lookup's chain on the rank-0 path. Returns per node ``(tokens, proposed)``."""
    n = tree.num_nodes
    return overlay_tree(tree, [0] * n, [False] * n, conts)


def overlay_tree(tree, toks: list[int], ok: list[bool], conts: list[list[int]],
                 min_share: float = 0.0) -> tuple[list[int], list[bool]]:
    """Merge the frequency-ranked trie of ``conts`` into a partly filled tree (``toks``/``ok`` per node,
    e.g. a drafter's tree with its pruned nodes unproposed); returns new lists.

    Walking down from the root, each trie branch whose share of ``conts`` (matches that agree with
    the whole path, over all matches: the trie's path probability) is ``>= min_share`` goes to the
    proposed child that already holds its token, else to the lowest-rank child slot still free; a
    branch with no room is dropped with its subtree. On an empty tree this is :func:`fill_tree`.
    Ties in frequency: earlier in ``conts`` first.
    """
    toks, ok = list(toks), list(ok)
    total = len(conts)
    if not total:
        return toks, ok
    queue: list[tuple[int, int, list[int]]] = [(-1, 0, list(range(total)))]  # (node, depth, members)
    while queue:
        node, d, members = queue.pop(0)
        kids = tree.children.get(node, ())
        if not kids:
            continue
        counts: dict[int, int] = {}
        for m in members:
            if len(conts[m]) > d:
                counts[conts[m][d]] = counts.get(conts[m][d], 0) + 1
        for t in sorted(counts, key=lambda x: -counts[x]):  # stable: earlier first on ties
            if counts[t] < min_share * total:
                break
            slot = next((c for c in kids if ok[c] and toks[c] == t), None)
            if slot is None:
                slot = next((c for c in kids if not ok[c]), None)
                if slot is None:
                    continue
                toks[slot], ok[slot] = t, True
            queue.append((slot, d + 1, [m for m in members if len(conts[m]) > d and conts[m][d] == t]))
    return toks, ok


def trie_paths(conts: list[list[int]], min_share: float = 0.0) -> dict[tuple[int, ...], float]:
    """The trie of ``conts`` as ``{token path: log share}``: the share is the fraction of ``conts`` that
    start with the path (the trie's path probability, as in :func:`overlay_tree`); paths held by fewer
    than ``min_share`` of them are left out (their extensions too). Every prefix of a path is present,
    earlier ``conts`` first; ``{}`` without continuations. For dynamic trees
    (:func:`decode.dynamic_tree.merge_scored`), where the shares rank against a drafter's path
    probabilities."""
    counts: dict[tuple[int, ...], int] = {}
    for c in conts:
        for d in range(1, len(c) + 1):
            counts[tuple(c[:d])] = counts.get(tuple(c[:d]), 0) + 1
    total = len(conts)
    keep = {p: n for p, n in counts.items() if n >= min_share * total}
    return {p: math.log(n / total) for p, n in keep.items() if all(p[:d] in keep for d in range(1, len(p)))}


class NGramDrafter(Drafter):
    """Prompt-lookup proposer; holds no tensors (its checkpoint has an empty ``model.safetensors``)."""

    kind = "ngram"
    config_class = NGramConfig

    def __init__(self, config: NGramConfig | None = None, target=None):
        super().__init__(config or NGramConfig())

    def check_compatible(self, target, vocab_size: int) -> None:
        """Any target: the proposer only copies the row's own token ids."""

    def forward(self, *args, **kwargs):
        raise TypeError("NGramDrafter has nothing to train; it only proposes at decode time")

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Looked-up tokens per row: LongTensor ``[B, k]`` (zero-padded past each row's continuation),
        ``probs=None``, ``lengths`` ``[B]`` = continuation length (0 without a match)."""
        conts = [lookup(t, k, self.config.max_ngram, self.config.min_ngram) if a and k else []
                 for t, a in zip(state.tokens, state.active)]
        rows = [c + [0] * (k - len(c)) for c in conts]
        return Proposal(tokens=torch.tensor(rows, dtype=torch.long).reshape(len(rows), k), probs=None,
                        lengths=torch.tensor([len(c) for c in conts], dtype=torch.long))

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """Per row, the frequency-ranked continuations of its last n-gram mapped onto ``tree``
        (:func:`fill_tree`); rows without a match propose nothing. Deterministic: ``probs=None``."""
        rows_t, rows_m = [], []
        for toks, active in zip(state.tokens, state.active):
            conts = continuations(toks, tree.max_depth, self.config.max_ngram, self.config.min_ngram) if active else []
            t, m = fill_tree(tree, conts)
            rows_t.append(t)
            rows_m.append(m)
        return Proposal(tokens=torch.tensor(rows_t, dtype=torch.long), probs=None,
                        mask=torch.tensor(rows_m, dtype=torch.bool))

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row, the trie of what followed its last n-gram (:func:`trie_paths`), ranked by the share of
        occurrences agreeing with each path, its best ``spec.total`` nodes (depth ``<= spec.depth``); rows
        without a match propose nothing. Deterministic: ``probs=None``."""
        rows = []
        for toks, active in zip(state.tokens, state.active):
            conts = continuations(toks, spec.depth, self.config.max_ngram, self.config.min_ngram) if active else []
            rows.append(merge_scored([], trie_paths(conts), spec.total) if conts else None)
        return pack_rows(rows)
