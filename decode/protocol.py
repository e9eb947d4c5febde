"""The proposal protocol: how any drafter plugs into ``decode.generate``.

One round of chain speculation (Leviathan et al. 2023; Chen et al. 2023):

    proposer.propose(state, k) -> k draft tokens per row (+ their draft distribution q, or None)
    target verifies [last committed token, d_1 .. d_k] in ONE forward
    accept a prefix of the draft tokens, add one bonus/correction token, roll back the rest

A proposer is any object with the members below. It never touches the target's cache; it sees the
committed tokens (and, if it asks, the target's hidden features) through :class:`DecodeState` and
keeps whatever private cache it wants, re-synchronising with ``state.num_stable``.

A custom proposer in a few lines (always proposes a repeat of the last token)::

    class Repeat:
        feature_layers = None
        def check_compatible(self, target, vocab_size): pass
        def reset(self, batch_size): pass
        def propose(self, state, k, sampling, generator):
            last = torch.tensor([row[-1] for row in state.tokens])
            return Proposal(tokens=last[:, None].repeat(1, k), probs=None)

    decode.generate(target, ids, drafter=Repeat(), max_new_tokens=64)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Decoding distribution. ``temperature == 0`` means greedy. ``top_k == 0`` and ``top_p == 1``
    disable those filters. The same params shape both the target's p and the drafter's q."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class DecodeState:
    """What the engine shows a proposer at each round.

    Attributes:
        tokens: per row, prompt + every committed token. The last token of each row has NOT been
            through the target yet (it is the bonus/correction token of the previous round, or the
            first token sampled from the prefill).
        num_stable: per row, how many leading entries of ``tokens[b]`` are unchanged since the
            previous ``propose`` call (0 on the first call). Entries past it are new; any private
            cache a proposer holds beyond ``num_stable[b]`` positions is stale and must be dropped.
        features: per row, a float tensor ``[len(tokens[b]) - 1, F]``: the target's hidden states at
            every position it has processed, concatenated over ``proposer.feature_layers`` (indices
            into transformers' ``output_hidden_states`` tuple: 0 = embeddings, L = last layer after
            the final norm). Row t is the state at the position that saw ``tokens[b][t]``, which is the
            state that predicts ``tokens[b][t + 1]``. ``None`` when the proposer asks for none.
        active: per row, False once the row has finished (its proposals are ignored).
        vocab_size: the number of token ids that may be proposed (ids ``>= vocab_size`` never are).
        num_draft_tokens: the K this decoding runs with (``num_draft_tokens``; a tree's depth), the most draft
            tokens a round asks for: a round near ``max_new_tokens`` asks fewer, and a proposer whose pass is
            shaped by K (DFlash's block, as vLLM runs it) reads K here. 0 where unknown.
    """

    tokens: list[list[int]]
    num_stable: list[int]
    features: list[torch.Tensor] | None
    active: list[bool]
    vocab_size: int
    num_draft_tokens: int = 0


@dataclass
class Proposal:
    """Draft tokens for one round.

    Attributes:
        tokens: LongTensor ``[B, k]`` of draft token ids, each ``< state.vocab_size``.
        probs: FloatTensor ``[B, k, V]``: the draft distribution q each draft token was SAMPLED from
            (same temperature/top-k/top-p as the target), or ``None`` for a deterministic proposer
            (treated as one-hot q, which keeps speculative sampling exact). ``V`` may exceed
            ``vocab_size`` (padding rows); entries there must be 0.
        lengths: LongTensor ``[B]`` or None: how many leading draft tokens each row really proposes
            (0..k). Tokens past it are ignored: not verified, not counted as drafted. A proposer with
            nothing worth proposing (e.g. prompt lookup without a match) returns 0, and when every
            row does, the round costs one plain target step. ``None`` means k for every row.
        mask: tree proposals only: bool ``[B, N]``, False for nodes a row does not propose (pruned
            by the drafter's confidence, or nothing to draft from). A node is verified only where it
            and all its ancestors are True; nodes False in every row are not sent to the target at
            all. ``None`` means every node.

        trees: dynamic tree proposals only (``propose_dynamic_tree``): per row, the
            ``decode.tree.DraftTree`` it drafted (None: nothing); row ``b``'s nodes are columns
            ``0 .. trees[b].num_nodes - 1`` of ``tokens`` in that tree's node order, further columns
            are padding (``mask`` False there).
        scores: dynamic tree proposals only, optional: FloatTensor ``[B, N]``, each node's cumulative
            draft log-probability (the EAGLE-2 ranking key; a wrapper merging branches into the tree
            ranks them against it).

    A tree proposal (:meth:`TreeProposer.propose_tree`) has ``tokens [B, N]`` in the tree's node order,
    ``probs=None`` (tree candidates are deterministic: the drafter's top-k) and ``lengths=None``.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    trees: list | None = None
    scores: torch.Tensor | None = None


@runtime_checkable
class Proposer(Protocol):
    """Anything ``decode.generate(drafter=...)`` accepts besides ``None`` and a transformers LM."""

    feature_layers: tuple[int, ...] | None

    def check_compatible(self, target: torch.nn.Module, vocab_size: int) -> None:
        """Raise ``ValueError`` (naming the mismatch) if this drafter cannot serve ``target``."""

    def reset(self, batch_size: int) -> None:
        """Drop all private state before a new ``generate`` call."""

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Return ``k`` draft tokens per row (rows with ``active[b] == False`` may hold anything)."""


# Optional members a proposer may also have (the decoder looks them up with getattr):
#   vocab_limit(target) -> int | None: the number of leading token ids it can propose for ``target``
#       (e.g. a draft model whose LM head has fewer padding rows); the decoder's vocabulary is the
#       smaller of this and the target's. ``decode.draft_model.DraftModel`` has it; wrappers delegate.
#   propose_tree(state, tree, sampling, generator) -> Proposal: tree drafts (TreeProposer below).
#   propose_dynamic_tree(state, spec, sampling, generator) -> Proposal: EAGLE-2 dynamic trees
#       (``decode.dynamic_tree.DynamicTree`` spec; ``Proposal.trees`` holds each row's tree). Every
#       drafters/ kind but the chain-only ones (dflash, dspark) has it; ``decode.dynamic_tree.TreeBuilder`` does the
#       expansion and reranking.


@runtime_checkable
class TreeProposer(Proposer, Protocol):
    """A proposer that can also draft a static tree (``decode.generate(tree=...)``)."""

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """Return one token per node of ``tree`` (a ``decode.tree.DraftTree``) per row: node ``i`` is the
        rank ``tree.ranks[i]`` candidate (0 = best) after the tokens of its ancestors. ``tokens [B, N]``,
        optional ``mask [B, N]``."""
