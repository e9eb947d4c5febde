"""Suffix decoding: the model-free proposer of SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975), as
Snowflake's Arctic Inference implements it and vLLM serves it (``speculative_config={"method": "suffix"}``).

Per row, a suffix tree over the prompt and every committed token (grown as tokens are committed); beside it
a global tree over the outputs already produced by this drafter (each row's output, FIFO-evicted beyond
``max_cached_requests`` outputs, as vLLM's cache), and optionally a static corpus (ShareGPT's assistant turns:
:func:`corpus_index` over the REST datastore's token streams). Each round every source proposes the most
frequent continuation of the row's longest useful suffix (:func:`drafters.lookup.suffix_tree.speculate`: the
draft grows with the matched length, ``max_spec_factor``, and stops where the estimated probability falls
below ``min_token_prob``); the best-scoring source wins (ties: the row's own tree, then the outputs, then the
corpus). Draft tokens are deterministic (one-hot q), so greedy decoding equals plain greedy decoding and
sampling stays exact. Trees: the suffix tree's top branches under the winning match (static trees by rank;
dynamic trees by estimated path probability).

Knobs keep vLLM's names without its ``suffix_decoding_`` prefix: ``max_tree_depth`` (24),
``max_cached_requests`` (10000; 0: no global tree of outputs), ``max_spec_factor`` (1.0), ``min_token_prob``
(0.1), plus Arctic Inference's ``max_spec_offset`` (0.0). vLLM's ``num_speculative_tokens`` is the decoder's
``num_draft_tokens`` (K): the most draft tokens per round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from drafterkit.assets.pinned import home
from drafterkit.decode.dynamic_tree import DynamicTree, merge_scored, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.base import Drafter
from drafterkit.drafters.lookup.suffix_tree import (
    CorpusSuffixIndex,
    Draft,
    SuffixTree,
    branch_paths,
    max_draft,
    speculate,
    suffix_array,
)


def _int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SuffixConfig:
    """Suffix decoding's knobs (vLLM's ``suffix_decoding_*`` fields, same meanings and defaults).

    Attributes:
        max_tree_depth: depth of every suffix tree: the matched context plus the draft never exceed it.
        max_cached_requests: outputs kept in the global tree (FIFO); 0 disables it (prompt trees still work).
        max_spec_factor: a match of ``m`` tokens drafts at most ``m * max_spec_factor + max_spec_offset``.
        max_spec_offset: see ``max_spec_factor`` (Arctic Inference's ``max_spec_offset``; vLLM leaves it 0).
        min_token_prob: a draft token's estimated probability (count ratios along the path) must reach this.

    Raises:
        ValueError: a knob outside its range, one line naming it and the range.
    """

    max_tree_depth: int = 24
    max_cached_requests: int = 10000
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1

    def __post_init__(self):
        checks = (("max_tree_depth", _int_at_least(self.max_tree_depth, 1), "an int >= 1"),
                  ("max_cached_requests", _int_at_least(self.max_cached_requests, 0),
                   "an int >= 0 (0: no global tree)"),
                  ("max_spec_factor", _finite(self.max_spec_factor) and self.max_spec_factor >= 0, "a number >= 0"),
                  ("max_spec_offset", _finite(self.max_spec_offset), "a finite number"),
                  ("min_token_prob", _finite(self.min_token_prob) and 0 <= self.min_token_prob <= 1,
                   "a number in [0, 1]"))
        for name, ok, need in checks:
            if not ok:
                raise ValueError(f"suffix decoding: {name} must be {need}, got {getattr(self, name)!r}")


class SuffixDrafter(Drafter):
    """Suffix decoding as a drafter (module docstring); holds no tensors (an empty ``model.safetensors``).

    Args:
        config: :class:`SuffixConfig` (defaults: vLLM's).
        target: unused (the proposer only reads token ids).
        corpus: a :class:`drafters.lookup.suffix_tree.CorpusSuffixIndex` of the same ``max_tree_depth`` (see
            :func:`corpus_index`), or None.

    Attributes:
        outputs: the global tree of the outputs produced so far (None when ``max_cached_requests`` is 0); it
            outlives ``reset``, so later ``generate`` calls draft from earlier answers as vLLM's server does.
        source_rows: rounds x rows whose draft came from each source (``prompt``, ``outputs``, ``corpus``) and
            rows with no draft (``none``), since the drafter was built.

    Raises:
        ValueError: a corpus index of another depth than ``config.max_tree_depth``.
    """

    kind = "suffix"
    config_class = SuffixConfig

    def __init__(self, config: SuffixConfig | None = None, target=None, corpus: CorpusSuffixIndex | None = None):
        super().__init__(config or SuffixConfig())
        if corpus is not None and corpus.max_depth != self.config.max_tree_depth:
            raise ValueError(f"suffix decoding: the corpus index has depth {corpus.max_depth}, the drafter's "
                             f"max_tree_depth is {self.config.max_tree_depth}: build the index at that depth")
        self.corpus = corpus
        self.outputs = SuffixTree(self.config.max_tree_depth) if self.config.max_cached_requests else None
        self._next_output = 0
        self._held: list[int] = []  # output ids in the global tree, oldest first (an active row's included)
        self._rows: list[dict | None] = []
        self.source_rows = {"prompt": 0, "outputs": 0, "corpus": 0, "none": 0}

    def settings(self) -> dict:
        """The knobs and the corpus size, as ``drafterkit eval`` records them: :class:`SuffixConfig`'s fields and
        ``corpus_tokens`` (None: no corpus)."""
        return dict(dataclasses.asdict(self.config), corpus_tokens=None if self.corpus is None else self.corpus.size)

    def check_compatible(self, target, vocab_size: int) -> None:
        """Any target (the proposer copies token ids); a corpus of a larger vocabulary is refused."""
        if self.corpus is not None and self.corpus.size and int(self.corpus.tokens.max()) >= vocab_size:
            raise ValueError(f"the suffix corpus holds ids up to {int(self.corpus.tokens.max())}; the target has "
                             f"{vocab_size}: build it with the target's tokenizer")

    def forward(self, *args, **kwargs):
        raise TypeError("SuffixDrafter has nothing to train; it only proposes at decode time")

    def reset(self, batch_size: int) -> None:
        """New requests: drop the per-row trees (the global tree of outputs stays)."""
        self._rows = [None] * batch_size

    # --- trees ---------------------------------------------------------------------------------------

    def _start_output(self) -> int | None:
        """A new output sequence in the global tree, evicting the oldest beyond ``max_cached_requests``."""
        if self.outputs is None:
            return None
        seq, self._next_output = self._next_output, self._next_output + 1
        while len(self._held) >= self.config.max_cached_requests:
            old = self._held.pop(0)
            if old in self.outputs:
                self.outputs.remove(old)
        self._held.append(seq)
        return seq

    def _update(self, b: int, tokens: list[int], stable: int) -> dict:
        """Bring row ``b``'s trees up to its committed ``tokens``: on the first call its prompt is
        ``tokens[:-1]`` and its output starts with the token the prefill sampled (as vLLM's
        ``start_request`` / ``add_active_response``); later calls append the new tokens."""
        row = self._rows[b]
        if row is not None and stable < row["seen"]:  # committed tokens changed (never in the engine): rebuild
            if row["output"] in self._held:
                self._held.remove(row["output"])
                if row["output"] in self.outputs:
                    self.outputs.remove(row["output"])
            row = None
        if row is None:
            row = self._rows[b] = dict(tree=SuffixTree(self.config.max_tree_depth), seen=len(tokens) - 1,
                                       prompt=len(tokens) - 1, output=self._start_output())
            row["tree"].extend(0, tokens[:-1])
        new = tokens[row["seen"]:]
        if new:
            row["tree"].extend(0, new)
            if row["output"] in self._held:  # not evicted since the row started (vLLM's cache stops there too)
                self.outputs.extend(row["output"], new)
            row["seen"] = len(tokens)
        return row

    def draft(self, b: int, tokens: list[int], stable: int, k: int) -> Draft:
        """Row ``b``'s best chain of at most ``k`` tokens over its sources (module docstring)."""
        row = self._update(b, tokens, stable)
        c = self.config
        best, name = Draft(), "none"
        sources = [("prompt", row["tree"]), ("outputs", self.outputs), ("corpus", self.corpus)]
        for label, src in sources:
            if src is None:
                continue
            d = speculate(src, tokens, k, c.max_spec_factor, c.max_spec_offset, c.min_token_prob)
            if d.tokens and (name == "none" or d.score > best.score):
                best, name = d, label
        self.source_rows[name] += 1
        return best

    # --- the proposer protocol -----------------------------------------------------------------------

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Per row its suffix draft: ``tokens`` LongTensor ``[B, k]`` (zero-padded), ``lengths`` ``[B]`` (0:
        no draft that round), ``probs=None`` (deterministic)."""
        drafts = self.drafts(state, k)
        rows = [d.tokens + [0] * (k - len(d.tokens)) for d in drafts]
        return Proposal(tokens=torch.tensor(rows, dtype=torch.long).reshape(len(rows), k), probs=None,
                        lengths=torch.tensor([len(d.tokens) for d in drafts], dtype=torch.long))

    def drafts(self, state: DecodeState, k: int) -> list[Draft]:
        """Per row its best chain draft of at most ``k`` tokens (an empty :class:`Draft` for inactive rows)."""
        if len(self._rows) != len(state.tokens):
            self.reset(len(state.tokens))
        return [self.draft(b, toks, stable, k) if active and k else Draft()
                for b, (toks, stable, active) in enumerate(zip(state.tokens, state.num_stable, state.active))]

    def _depth(self, d: Draft, depth: int) -> int:
        """How deep a tree drafted from ``d``'s match may go: ``depth``, or less where the match earns less."""
        c = self.config
        return max_draft(d.match_len, depth, c.max_spec_factor, c.max_spec_offset)

    def row_tree(self, d: Draft, tree) -> tuple[list[int], list[bool]]:
        """The static ``tree`` filled from ``d``'s match (see :meth:`propose_tree`): per node ``(token, proposed)``."""
        toks, mask = [0] * tree.num_nodes, [False] * tree.num_nodes
        if not d.tokens:
            return toks, mask
        src, depth, floor = d.source, self._depth(d, tree.max_depth), self.config.min_token_prob
        at: dict[tuple[int, ...], tuple] = {(): (d.node, 1.0)}
        kids: dict[tuple[int, ...], list] = {}
        for i, ranks in enumerate(tree.paths):
            parent = at.get(ranks[:-1])
            if parent is None or len(ranks) > depth:
                continue
            if ranks[:-1] not in kids:
                kids[ranks[:-1]] = src.children(parent[0])
            ranked = kids[ranks[:-1]]
            if ranks[-1] >= len(ranked):
                continue
            token, count, child = ranked[ranks[-1]]
            total = src.count(parent[0])
            prob = parent[1] if count == total else parent[1] * count / total
            if prob < floor:
                continue
            at[ranks] = (child, prob)
            toks[i], mask[i] = token, True
        return toks, mask

    def row_paths(self, d: Draft, depth: int, total: int) -> dict[tuple[int, ...], float]:
        """``{token path: log estimated probability}``: the ``total`` most probable branches under ``d``'s
        match (:func:`drafters.lookup.suffix_tree.branch_paths`), ``{}`` without a draft."""
        if not d.tokens:
            return {}
        paths = branch_paths(d.source, d.node, self._depth(d, depth), self.config.min_token_prob, total)
        return {p: math.log(q) for p, q in paths.items()}

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """Per row the suffix tree's branches on the static ``tree``, from the match of its best chain draft:
        node ``(r1, r2, ..)`` takes the ``r1``-th most frequent continuation of the match, then the ``r2``-th
        after it, ...; nodes with no such branch, one below ``min_token_prob`` or deeper than the match earns
        (``max_spec_factor``) are masked. ``tokens [B, N]``, ``mask [B, N]``, ``probs=None``."""
        rows = [self.row_tree(d, tree) for d in self.drafts(state, tree.max_depth)]
        n = tree.num_nodes
        return Proposal(tokens=torch.tensor([t for t, _ in rows], dtype=torch.long).reshape(len(rows), n),
                        probs=None, mask=torch.tensor([m for _, m in rows], dtype=torch.bool).reshape(len(rows), n))

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row the ``spec.total`` most probable branches (depth ``<= spec.depth`` and what the match earns)
        under its best chain draft's match, scored by log estimated path probability; rows without a match
        propose nothing."""
        rows = []
        for d in self.drafts(state, spec.depth):
            paths = self.row_paths(d, spec.depth, spec.total)
            rows.append(merge_scored([], paths, spec.total) if paths else None)
        return pack_rows(rows)


def corpus_index(datastore, max_depth: int = 24, log=None) -> CorpusSuffixIndex:
    """The suffix-tree index of a REST datastore's token streams (``drafters.lookup.datastore.Datastore``: ShareGPT's
    assistant turns by default), its suffix array cached beside the datastore's ``.npz`` (or under
    ``$DRAFTERKIT_HOME/datastores`` for one held in memory), keyed by the corpus and the depth.
    ``log`` (a callable taking a string) hears when it is built."""
    tokens = np.ascontiguousarray(datastore.tokens, dtype=np.int32)
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()[:16] if tokens.size < (1 << 22) else None
    path = Path(datastore.path) if getattr(datastore, "path", None) else None
    name = (path.stem if path and digest is None else digest) or "corpus"
    cache = (path.parent if path else home() / "datastores") / f"{name}.suffix{max_depth}.npy"
    if cache.is_file():
        sa = np.load(cache, allow_pickle=False)
        if sa.size == int((tokens != -1).sum()):
            return CorpusSuffixIndex(tokens, max_depth, sa=sa)
    sa = suffix_array(tokens, max_depth)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".partial.npy")
    np.save(tmp, sa)
    tmp.replace(cache)
    if log is not None:
        log(f"suffix index: {sa.size:,} corpus suffixes sorted to depth {max_depth} -> {cache}")
    return CorpusSuffixIndex(tokens, max_depth, sa=sa)


__all__ = ["SuffixConfig", "SuffixDrafter", "corpus_index"]
