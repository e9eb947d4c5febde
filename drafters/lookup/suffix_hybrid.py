"""A trained drafter behind suffix decoding (``PATH+suffix``): per row and round, the suffix draft where its
score (its expected accepted tokens, :mod:`drafters.lookup.suffix_tree`) reaches ``min_score``, else the drafter's.

This is Arctic Inference's hybrid (its ``arctic`` speculator with ``enable_suffix_decoding``): a suffix
draft is used when its score is at least the speculator's draft length, so the drafter keeps every round
where the suffix trees are not confident of beating it. ``min_score=None`` does the same here: ``k`` for
chains, the tree's depth for trees. The drafter is skipped in rounds where every active row takes the suffix
draft and catches up through ``DecodeState.num_stable`` (as :class:`drafters.lookup.hybrid.LookupHybrid`, whose
bookkeeping this reuses). Exact: which source a row uses depends only on its committed tokens, and suffix
drafts are deterministic (one-hot q).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from drafterkit.decode.dynamic_tree import DynamicTree, merge_scored, pack_rows, row_tree_of
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.lookup.hybrid import LookupHybrid
from drafterkit.drafters.suffix import SuffixDrafter


class SuffixHybrid(LookupHybrid):
    """``drafter`` behind suffix decoding ``suffix`` (a :class:`drafters.suffix.SuffixDrafter`).

    Args:
        drafter: the fallback proposer (a loaded drafter).
        suffix: the suffix decoder (default: vLLM's knobs, no corpus).
        min_score: a row takes the suffix draft when its score is >= this; None: the draft length the
            drafter would propose (``k``, or the tree's depth), as Arctic Inference does.

    Raises:
        ValueError: ``min_score`` negative or not finite.
        TypeError: ``drafter`` is not a proposer, or ``suffix`` not a ``SuffixDrafter``.
    """

    def __init__(self, drafter, suffix: SuffixDrafter | None = None, min_score: float | None = None):
        super().__init__(drafter)
        if suffix is not None and not isinstance(suffix, SuffixDrafter):
            raise TypeError(f"suffix must be a drafters.suffix.SuffixDrafter, got {type(suffix).__name__}")
        if min_score is not None and not (isinstance(min_score, (int, float)) and math.isfinite(min_score)
                                          and min_score >= 0):
            raise ValueError(f"SuffixHybrid: min_score must be a finite number >= 0 or None, got {min_score!r}")
        self.suffix = suffix or SuffixDrafter()
        self.min_score = min_score
        self.kind = f"{getattr(drafter, 'kind', type(drafter).__name__)}+suffix"

    def settings(self) -> dict:
        """The suffix knobs (:meth:`drafters.suffix.SuffixDrafter.settings`) and ``min_score`` (``None``: the draft
        length), as ``drafterkit eval`` records them."""
        return dict(self.suffix.settings(), min_score=self.min_score)

    def check_compatible(self, target: torch.nn.Module, vocab_size: int) -> None:
        self.drafter.check_compatible(target, vocab_size)
        self.suffix.check_compatible(target, vocab_size)

    def reset(self, batch_size: int) -> None:
        super().reset(batch_size)
        self.suffix.reset(batch_size)

    def _pick(self, state: DecodeState, length: int) -> list:
        """Per row its suffix draft where it clears the bar, else None; counts the round."""
        bar = length if self.min_score is None else self.min_score
        drafts = self.suffix.drafts(state, length)
        picked = [d if d.tokens and d.score >= bar else None for d in drafts]
        return picked

    def _inner(self, state: DecodeState, picked: list) -> DecodeState | None:
        """The drafter's view of this round, or None when every active row took its suffix draft."""
        stable, n_active, copied = self._count(state, picked)
        if n_active and copied == n_active:
            self._stable = stable
            return None
        self._stable = None
        return replace(state, num_stable=stable)

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Per row the suffix draft (``lengths[b]`` its length, one-hot q) or the drafter's chain; ``tokens [B, k]``."""
        picked = self._pick(state, k) if k else [None] * len(state.tokens)
        inner = self._inner(state, picked)
        if inner is None:
            drafts = [d.tokens if d is not None else [] for d in picked]  # inactive rows: nothing
            rows = [t + [0] * (k - len(t)) for t in drafts]
            return Proposal(tokens=torch.tensor(rows, dtype=torch.long).reshape(len(rows), k), probs=None,
                            lengths=torch.tensor([len(t) for t in drafts], dtype=torch.long))
        prop = self.drafter.propose(inner, k, sampling, generator)
        tokens = prop.tokens.clone()
        lengths = (prop.lengths.clone() if prop.lengths is not None
                   else torch.full((tokens.shape[0],), k, dtype=torch.long))
        probs = prop.probs.clone() if prop.probs is not None else None
        for b, d in enumerate(picked):
            if d is None:
                continue
            n = len(d.tokens)
            tokens[b, :n] = torch.tensor(d.tokens, dtype=tokens.dtype, device=tokens.device)
            lengths[b] = n
            if probs is not None:
                probs[b, :n] = 0
                probs[b, torch.arange(n, device=probs.device), tokens[b, :n].to(probs.device)] = 1
        return Proposal(tokens=tokens, probs=probs, lengths=lengths)

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """Rows whose suffix draft clears the bar take the suffix tree's branches on ``tree``
        (:meth:`drafters.suffix.SuffixDrafter.row_tree`), the others the drafter's tree.

        Raises:
            ValueError: the wrapped drafter cannot propose trees.
        """
        if not callable(getattr(self.drafter, "propose_tree", None)):
            raise ValueError(f"{self.kind}: the wrapped drafter proposes chains only (as dflash does); decode it "
                             "with chains (--tree chain)")
        picked = self._pick(state, tree.max_depth)
        inner = self._inner(state, picked)
        b_all, n = len(state.tokens), tree.num_nodes
        if inner is None:
            tokens, mask = torch.zeros(b_all, n, dtype=torch.long), torch.zeros(b_all, n, dtype=torch.bool)
        else:
            prop = self.drafter.propose_tree(inner, tree, sampling, generator)
            tokens = torch.as_tensor(prop.tokens).clone().cpu()
            mask = (torch.ones(b_all, n, dtype=torch.bool) if prop.mask is None
                    else torch.as_tensor(prop.mask).clone().bool().cpu())
        for b, d in enumerate(picked):
            if d is not None:
                row_t, row_m = self.suffix.row_tree(d, tree)
                tokens[b], mask[b] = torch.tensor(row_t, dtype=torch.long), torch.tensor(row_m, dtype=torch.bool)
        return Proposal(tokens=tokens, probs=None, mask=mask)

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Dynamic-tree version of :meth:`propose_tree`: suffix rows rank the suffix tree's branches by estimated
        path probability (:meth:`drafters.suffix.SuffixDrafter.row_paths`), the others take the drafter's tree.

        Raises:
            ValueError: the wrapped drafter cannot grow dynamic trees.
        """
        if not callable(getattr(self.drafter, "propose_dynamic_tree", None)):
            raise ValueError(f"{self.kind}: the wrapped drafter cannot grow dynamic trees; give a static tree "
                             "such as 3,2,1")
        picked = self._pick(state, spec.depth)
        inner = self._inner(state, picked)
        rows: list = [None] * len(state.tokens)
        if inner is not None:
            prop = self.drafter.propose_dynamic_tree(inner, spec, sampling, generator)
            rows = [row_tree_of(prop, b) for b in range(len(rows))]
        for b, d in enumerate(picked):
            if d is not None:
                rows[b] = merge_scored([], self.suffix.row_paths(d, spec.depth, spec.total), spec.total)
        return pack_rows(rows)


__all__ = ["SuffixHybrid"]
