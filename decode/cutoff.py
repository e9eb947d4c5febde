"""Confidence-based draft length for chain drafters: :class:`ChainCutoff`."""

from __future__ import annotations

import torch

from drafterkit.decode.sampling import sanitize_logits


class ChainCutoff:
    """Confidence-based draft length for chain drafters: EAGLE-2's path-confidence criterion (Li et al.
    2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees"; the draft model's
    confidence approximates the acceptance rate) applied to a chain.

    Row ``b`` keeps drafting while ``prod_{i<=j} q_b(d_i)`` stays ``>= threshold``, where ``q_b(d_i)`` is the
    drafter's probability of its ``i``-th token (softmax of its logits at temperature 1 when greedy; the
    distribution it sampled from otherwise). The first token below ends the chain and is not proposed,
    so a row may propose 0 tokens (the decoder then runs a plain step for it). Verification cost on a
    CPU grows with every drafted token, so cutting unlikely tails raises tokens/s while lowering tau.

    Usage: ``cut = ChainCutoff(threshold, batch)``; after each draft position ``j``:
    ``cut.update(j, tokens, logits=..., probs=..., vocab_size=...)``; stop drafting when ``cut.done``; pass ``cut.lengths``
    (LongTensor ``[B]``, or None when ``threshold <= 0``) as ``Proposal.lengths``.
    """

    def __init__(self, threshold: float, batch_size: int, k: int):
        self.threshold = float(threshold)
        self.path = torch.ones(batch_size)
        self._lengths = torch.full((batch_size,), k, dtype=torch.long)
        self._open = torch.ones(batch_size, dtype=torch.bool)

    def update(self, j: int, tokens: torch.Tensor, logits: torch.Tensor | None = None,
               probs: torch.Tensor | None = None, vocab_size: int | None = None) -> None:
        """Record draft position ``j``: ``tokens [B]`` chosen from ``logits [B, V']`` (greedy; ids
        ``>= vocab_size`` are masked as ``decode.sampling.sanitize_logits`` does) or ``probs [B, V']``
        (sampling; same index space as ``tokens``). A no-op when the cutoff is off."""
        if self.threshold <= 0:
            return
        if probs is None:
            probs = torch.softmax(sanitize_logits(logits, vocab_size), -1)
        q = probs.float().gather(-1, tokens.reshape(-1, 1).to(probs.device)).reshape(-1).cpu()
        self.path = self.path * q
        stop = self._open & (self.path < self.threshold)
        self._lengths[stop] = j
        self._open &= ~stop

    @property
    def done(self) -> bool:
        """True once every row's chain has ended (no need to draft further positions)."""
        return self.threshold > 0 and not bool(self._open.any())

    @property
    def lengths(self) -> torch.Tensor | None:
        return self._lengths.clone() if self.threshold > 0 else None
