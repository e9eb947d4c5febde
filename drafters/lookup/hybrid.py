"""Prompt lookup first, a trained drafter otherwise: one proposer, chosen per row and per round.

Small chat targets decoding greedily repeat themselves (lists, loops, code identifiers), and there
copying the row's own earlier tokens is both free and more often right than a small learned head.
Elsewhere the learned drafter is better. :class:`LookupHybrid` looks up every row every round and
proposes the looked-up continuation where the row's last ``min_match`` or more tokens occurred before
(longest match first, :func:`drafters.ngram.lookup`), else the drafter's own chain. The same
division of labour as Snowflake's Arctic Inference (suffix decoding with its trained speculator as
the fallback) and SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding
for Emerging AI Applications"), here with prompt lookup (Saxena 2023) as the copy mechanism.

The drafter runs in every round where some row needs it (rows that then use the lookup discard its
chain); in rounds where every row copies it is skipped, and on its next call it is told how much of
each row is unchanged since ITS last call (the smallest ``DecodeState.num_stable`` over the rounds in
between), so its private caches re-synchronise exactly as the decoder protocol requires. Exactness: which
source a row uses depends only on the committed tokens, and a looked-up continuation is deterministic
(one-hot q), so greedy output equals plain greedy decoding and sampling stays exact.

With a ``datastore`` (:class:`drafters.lookup.datastore.Datastore`, REST: He et al. 2023, "REST:
Retrieval-Based Speculative Decoding") rows without a prompt-lookup match also look their last n-gram
up in a corpus (ShareGPT's assistant turns by default). In tree drafts, the corpus's frequency-ranked
continuations are merged into the drafter's tree (:func:`drafters.ngram.overlay_tree`): the branches
that at least ``datastore_share`` of the corpus matches agree with join the nodes the drafter proposed
or take the slots its threshold left free, and the target verifies both in the same pass; corpus
branches stop at ``datastore_depth`` (3) tokens, past which they were rarely accepted. In chains,
a row uses the corpus's majority continuation instead of the drafter's chain when at least
``CHAIN_SHARE`` of the matches agree on its first token. Rows that copy from their prompt take no corpus
branches. The measurements behind these rules: docs/benchmarks/lookup-and-retrieval.md, "Retrieval (REST)".

Not a checkpoint kind: build it around a loaded drafter (``drafterkit eval --drafter PATH+ngram``, or
``PATH+rest`` for prompt lookup plus the datastore of ``--datastore``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from drafterkit.decode.dynamic_tree import DynamicTree, merge_scored, pack_rows, row_tree_of
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.base import Checked
from drafterkit.drafters.ngram import continuations, fill_tree, lookup, overlay_tree, trie_paths

#: a chain row copies the datastore's majority continuation when at least this share of the corpus
#: matches agree on its first token (chosen on MT-bench continuations of the target: 0.5-0.85 alike)
CHAIN_SHARE = 0.7


def majority_chain(conts: list[list[int]], k: int, first_share: float, share: float) -> list[int]:
    """The rank-0 path (up to ``k`` ids) of the frequency-ranked trie of ``conts``: the most common
    first token, then the most common next one among the continuations that start so, and so on; empty
    unless the first token is held by >= ``first_share`` of ``conts``, and cut where fewer than
    ``share`` of them agree with the whole path."""
    out, members = [], conts
    for d in range(k):
        counts: dict[int, int] = {}
        for c in members:
            if len(c) > d:
                counts[c[d]] = counts.get(c[d], 0) + 1
        if not counts:
            break
        t = max(counts, key=counts.get)
        if counts[t] < (first_share if d == 0 else share) * len(conts):
            break
        out.append(t)
        members = [c for c in members if len(c) > d and c[d] == t]
    return out


def _share(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and 0.0 < value <= 1.0


def _count(value: Any) -> bool:
    return isinstance(value, int) and value >= 1


class LookupHybrid:
    """Wrap ``drafter`` (any proposer) so that rows with a prompt-lookup match of ``>= min_match``
    tokens propose the looked-up continuation instead.

    Args:
        drafter: the fallback proposer (a loaded drafter: draft LM, Medusa, EAGLE, EAGLE-3).
        max_ngram: longest suffix of the row tried as the lookup key.
        min_match: shortest key accepted (docs/benchmarks/lookup-and-retrieval.md, the lookup key length).
        datastore: optional :class:`drafters.lookup.datastore.Datastore` looked up for rows without a match.
        datastore_share: a corpus branch joins a tree when at least this share of the matches agree
            with its whole path (and a chain is cut there); in ``(0, 1]``.
        datastore_matches: corpus matches read per lookup (evenly spaced over all of them).
        datastore_depth: the corpus proposes at most this many tokens per branch (trees) or chain.
            Default 3, the fastest depth measured (docs/benchmarks/lookup-and-retrieval.md, "Retrieval
            (REST)").

    ``datastore_share``, ``datastore_matches`` and ``datastore_depth`` may be changed on the object
    (``hybrid.datastore_depth = 2``); they are checked on every assignment, as in ``__init__``.

    Raises:
        ValueError: ``1 <= min_match <= max_ngram`` does not hold, or (here or on a later assignment)
            ``datastore_share`` is not a number in ``(0, 1]``, or ``datastore_matches`` /
            ``datastore_depth`` is not an int >= 1 (a bool is neither).
    """

    #: a corpus branch joins a tree when at least this share of the matches agree with its whole path
    datastore_share = Checked(_share, "LookupHybrid needs 0 < {name} <= 1, got {value!r}", convert=float)
    #: corpus matches read per lookup
    datastore_matches = Checked(_count, "LookupHybrid needs an int {name} >= 1, got {value!r}")
    #: the corpus proposes at most this many tokens per branch or chain
    datastore_depth = Checked(_count, "LookupHybrid needs an int {name} >= 1, got {value!r}")

    def __init__(self, drafter, *, max_ngram: int = 3, min_match: int = 2, datastore=None,
                 datastore_share: float = 0.2, datastore_matches: int = 64, datastore_depth: int = 3):
        if not 1 <= min_match <= max_ngram:
            raise ValueError(f"LookupHybrid needs 1 <= min_match <= max_ngram, got min_match={min_match}, "
                             f"max_ngram={max_ngram}")
        # checked by their descriptors (drafters.base.Checked), before the drafter and datastore are
        self.datastore_share, self.datastore_matches = datastore_share, datastore_matches
        self.datastore_depth = datastore_depth
        if drafter is None or not callable(getattr(drafter, "propose", None)):
            raise TypeError(f"LookupHybrid wraps a drafter (a loaded checkpoint or any proposer), got "
                            f"{type(drafter).__name__}; for prompt lookup alone use drafters.ngram.NGramDrafter")
        if datastore is not None and not callable(getattr(datastore, "continuations", None)):
            raise TypeError(f"datastore must be a drafters.lookup.datastore.Datastore (e.g. "
                            f"cached_datastore('sharegpt', tokenizer)), got {type(datastore).__name__}")
        self.drafter, self.max_ngram, self.min_match, self.datastore = drafter, max_ngram, min_match, datastore
        self.kind = f"{getattr(drafter, 'kind', type(drafter).__name__)}+{'rest' if datastore is not None else 'ngram'}"
        #: rounds x rows that proposed a looked-up continuation / the drafter's chain (since reset)
        self.lookup_rows = self.drafter_rows = 0
        self._stable: list[int] | None = None

    def settings(self) -> dict:
        """The lookup and retrieval settings, as recorded by ``drafterkit eval`` for its ``+rest`` rows:
        ``{datastore_share, datastore_matches, datastore_depth, max_ngram, min_match}``."""
        return dict(datastore_share=self.datastore_share, datastore_matches=self.datastore_matches,
                    datastore_depth=self.datastore_depth, max_ngram=self.max_ngram, min_match=self.min_match)

    @property
    def feature_layers(self):
        return self.drafter.feature_layers

    @property
    def supports_draft_threshold(self) -> bool:
        return bool(getattr(self.drafter, "supports_draft_threshold", False))

    @property
    def draft_threshold(self) -> float:
        """The wrapped drafter's confidence cutoff (applies to its chains only)."""
        return float(getattr(self.drafter, "draft_threshold", 0.0))

    @draft_threshold.setter
    def draft_threshold(self, value: float) -> None:
        self.drafter.draft_threshold = value

    @property
    def expand_threshold(self) -> float:
        """The wrapped drafter's ``expand_threshold`` (with a datastore, raised to ``datastore_share``
        during its calls: nodes below the share are verified as leaves)."""
        return float(getattr(self.drafter, "expand_threshold", 0.0))

    @expand_threshold.setter
    def expand_threshold(self, value: float) -> None:
        self.drafter.expand_threshold = value

    def check_compatible(self, target: torch.nn.Module, vocab_size: int) -> None:
        self.drafter.check_compatible(target, vocab_size)
        if self.datastore is not None and self.datastore.vocab_size > vocab_size:
            raise ValueError(f"the datastore holds ids of a {self.datastore.vocab_size}-token vocabulary; the target "
                             f"has {vocab_size}: build it with the target's tokenizer")

    def vocab_limit(self, target: torch.nn.Module) -> int | None:
        """The wrapped drafter's vocabulary limit for ``target`` (``None``: the target's)."""
        limit = getattr(self.drafter, "vocab_limit", None)
        return limit(target) if callable(limit) else None

    def reset(self, batch_size: int) -> None:
        self.drafter.reset(batch_size)
        self.lookup_rows = self.drafter_rows = 0
        self._stable = None  # per row, what the drafter's caches still match (None: it ran last round)

    def _count(self, state: DecodeState, conts: list) -> tuple[list[int], int, int]:
        """Count this round's lookup and drafter rows; return ``(stable, active rows, rows with a match)``.
        Rows may be rolled back between calls: what the drafter saw last stays valid only up to the
        smallest ``num_stable`` of every round since its last call (``stable``)."""
        stable = (list(state.num_stable) if self._stable is None
                  else [min(a, b) for a, b in zip(self._stable, state.num_stable)])
        n_active, copied = sum(bool(a) for a in state.active), sum(bool(c) for c in conts)
        self.lookup_rows += copied
        self.drafter_rows += n_active - copied
        return stable, n_active, copied

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Per row, the looked-up continuation (``lengths[b]`` = its length, one-hot q) or the drafter's
        chain; ``tokens [B, k]``. When every active row has a match the drafter is not run this round
        (no drafting time); it catches up on the next call it gets."""
        # lookup() only returns continuations of keys of >= min_match tokens; inactive rows get none
        conts = [lookup(row, k, self.max_ngram, self.min_match) if active and k else []
                 for row, active in zip(state.tokens, state.active)]
        if self.datastore is not None and k:
            conts = [c or (self._corpus_chain(row, k) if active else [])
                     for c, row, active in zip(conts, state.tokens, state.active)]
        stable, n_active, copied = self._count(state, conts)
        if k and n_active and copied == n_active:
            self._stable = stable
            rows = [c + [0] * (k - len(c)) for c in conts]
            return Proposal(tokens=torch.tensor(rows, dtype=torch.long).reshape(len(rows), k), probs=None,
                            lengths=torch.tensor([len(c) for c in conts], dtype=torch.long))
        self._stable = None
        inner = replace(state, num_stable=stable)
        prop = self.drafter.propose(inner, k, sampling, generator)
        tokens = prop.tokens.clone()
        lengths = (prop.lengths.clone() if prop.lengths is not None
                   else torch.full((tokens.shape[0],), k, dtype=torch.long))
        probs = prop.probs.clone() if prop.probs is not None else None
        for b, cont in enumerate(conts):
            if not cont:
                continue
            n = len(cont)
            tokens[b, :n] = torch.tensor(cont, dtype=tokens.dtype, device=tokens.device)
            lengths[b] = n
            if probs is not None:
                probs[b, :n] = 0
                probs[b, torch.arange(n, device=probs.device), tokens[b, :n].to(probs.device)] = 1
        return Proposal(tokens=tokens, probs=probs, lengths=lengths)

    def _corpus_chain(self, row: list[int], k: int) -> list[int]:
        """The datastore's majority continuation of ``row`` (:func:`majority_chain`: first token held
        by >= ``CHAIN_SHARE`` of the matches, longer paths by >= ``datastore_share``)."""
        depth = min(k, self.datastore_depth)
        return majority_chain(self.datastore.continuations(row, depth, self.datastore_matches), depth, CHAIN_SHARE,
                              self.datastore_share)

    def _drafter_tree(self, state: DecodeState, tree, sampling: SamplingParams, generator) -> Proposal:
        """The drafter's tree. With a datastore, only the drafter's nodes that clear the corpus's bar
        get children: its ``expand_threshold`` is raised to ``datastore_share`` for the call, so a
        node between its ``draft_threshold`` and the share is verified as a leaf, without the drafter
        pass that would draft its children (the fastest of the rules measured in
        docs/benchmarks/lookup-and-retrieval.md, "Retrieval (REST)")."""
        method = getattr(self.drafter, "propose_dynamic_tree" if isinstance(tree, DynamicTree) else "propose_tree")
        if self.datastore is None or not getattr(self.drafter, "supports_draft_threshold", False):
            return method(state, tree, sampling, generator)
        own = getattr(self.drafter, "expand_threshold", 0.0)
        self.drafter.expand_threshold = max(own, self.datastore_share)
        try:
            return method(state, tree, sampling, generator)
        finally:
            self.drafter.expand_threshold = own

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """Tree version of :meth:`propose`: a row with a lookup match proposes what followed every
        earlier occurrence of its last n-gram, as a frequency-ranked trie mapped onto ``tree``
        (:func:`drafters.ngram.fill_tree`; with one occurrence, prompt lookup's chain on the rank-0
        path); the other rows the drafter's tree, with the datastore's branches merged in when there is
        one (:func:`drafters.ngram.overlay_tree`, ``datastore_share``). When every active row has a
        match the drafter is not run (running it anyway raised tau but cost more than it won).

        Raises:
            ValueError: the wrapped drafter cannot propose trees.
        """
        if not callable(getattr(self.drafter, "propose_tree", None)):
            raise ValueError(f"{self.kind}: the wrapped drafter proposes chains only (as dflash does); decode it "
                             "with chains (--tree chain)")
        conts = [continuations(row, tree.max_depth, self.max_ngram, self.min_match) if active else []
                 for row, active in zip(state.tokens, state.active)]
        stable, n_active, copied = self._count(state, conts)
        b_all, n = len(state.tokens), tree.num_nodes
        if n_active and copied == n_active:
            self._stable = stable
            tokens = torch.zeros(b_all, n, dtype=torch.long)
            mask = torch.zeros(b_all, n, dtype=torch.bool)
        else:
            self._stable = None
            inner = replace(state, num_stable=stable)
            prop = self._drafter_tree(inner, tree, sampling, generator)
            tokens = torch.as_tensor(prop.tokens).clone().cpu()
            mask = (torch.ones(b_all, n, dtype=torch.bool) if prop.mask is None
                    else torch.as_tensor(prop.mask).clone().bool().cpu())
        for b, cont in enumerate(conts):
            if cont:
                row_t, row_m = fill_tree(tree, cont)
                tokens[b], mask[b] = torch.tensor(row_t, dtype=torch.long), torch.tensor(row_m, dtype=torch.bool)
            elif self.datastore is not None and state.active[b]:  # the drafter's tree + the corpus's
                ds = self.datastore.continuations(state.tokens[b], min(tree.max_depth, self.datastore_depth),
                                                  self.datastore_matches)
                if ds:
                    row_t, row_m = overlay_tree(tree, tokens[b].tolist(), mask[b].tolist(), ds, self.datastore_share)
                    tokens[b], mask[b] = torch.tensor(row_t, dtype=torch.long), torch.tensor(row_m, dtype=torch.bool)
        return Proposal(tokens=tokens, probs=None, mask=mask)

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Dynamic-tree version of :meth:`propose_tree` (EAGLE-2 ranking, :mod:`decode.dynamic_tree`): a row
        with a lookup match proposes the trie of what followed its last n-gram, ranked by the share of the
        occurrences agreeing with each path (:func:`drafters.ngram.trie_paths`); the other rows the
        drafter's dynamic tree, into which, with a datastore, the corpus's branches held by at least
        ``datastore_share`` of its matches join the same ranking: a branch's score is the log of that
        share, the drafter's nodes score their cumulative draft log-probability, and the best
        ``spec.total`` of the union are verified (:func:`decode.dynamic_tree.merge_scored`). When every
        active row has a match the drafter is not run.

        Raises:
            ValueError: the wrapped drafter cannot grow dynamic trees.
        """
        if not callable(getattr(self.drafter, "propose_dynamic_tree", None)):
            raise ValueError(f"{self.kind}: the wrapped drafter cannot grow dynamic trees (propose_dynamic_tree); "
                             "give a static tree such as 3,2,1")
        conts = [continuations(row, spec.depth, self.max_ngram, self.min_match) if active else []
                 for row, active in zip(state.tokens, state.active)]
        stable, n_active, copied = self._count(state, conts)
        rows: list = [None] * len(state.tokens)
        if n_active and copied == n_active:
            self._stable = stable
        else:
            self._stable = None
            inner = replace(state, num_stable=stable)
            prop = self._drafter_tree(inner, spec, sampling, generator)
            rows = [row_tree_of(prop, b) for b in range(len(rows))]
        for b, cont in enumerate(conts):
            if cont:
                rows[b] = merge_scored([], trie_paths(cont), spec.total)
            elif self.datastore is not None and state.active[b]:
                ds = self.datastore.continuations(state.tokens[b], min(spec.depth, self.datastore_depth),
                                                  self.datastore_matches)
                if ds:
                    rows[b] = merge_scored([rows[b]], trie_paths(ds, self.datastore_share), spec.total)
        return pack_rows(rows)


def drafts_trees(proposer, method: str = "propose_tree") -> bool:
    """Whether ``proposer`` drafts trees through ``method`` (``propose_tree`` or ``propose_dynamic_tree``): it has
    the method and, for a :class:`LookupHybrid`, so does the drafter it wraps (a chain-only drafter such as
    DFlash behind prompt lookup still drafts chains only)."""
    inner = proposer.drafter if isinstance(proposer, LookupHybrid) else proposer
    return callable(getattr(proposer, method, None)) and callable(getattr(inner, method, None))

