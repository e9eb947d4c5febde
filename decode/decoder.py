"""The decoder's state for one ``decode.generate`` call and the steps every round shares.

:class:`Decoder` holds what a round reads and writes: the rows' tokens and outputs, the target's KV cache,
the feature buffer a feature-reading drafter sees, the counters. The functions below are the steps both
round shapes (``decode.chain_round.chain_round``, ``decode.tree_round.tree_round``) take: ask the proposer
on the drafting clock (:func:`timed_proposal`), screen draft ids outside the vocabulary (:func:`screen_ids`),
commit a row's accepted tokens and bonus token (:func:`commit`), keep the target's features
(:func:`store_features`), tell :func:`watch_rounds` hooks (:func:`notify`). Loop shape after
pytorch-labs/gpt-fast: state in one small object, each step a plain function over it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from drafterkit.decode import attention, compiled
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.metrics import DecodeCounts
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.decode.sampling import select_tokens

_ROUND_HOOKS: list[Callable[[RoundInfo], None]] = []


@dataclass
class RoundInfo:
    """What a :func:`watch_rounds` callback sees after prefill (round 0) and after each round."""

    round: int
    cache_length: int  # columns in the target's KV cache
    mask_length: int  # columns the engine believes the cache holds
    valid_columns: list[int]  # per row, unmasked cache columns
    n_real: list[int]  # per row, tokens the target has processed
    tokens: list[list[int]]  # per row, prompt + committed tokens
    active: list[bool]
    # per row, the draft tokens this chain round verified (cut at the row's limit: remaining budget,
    # invalid ids, the proposer's lengths); [] after prefill, for finished rows and in tree rounds
    drafts: list[list[int]] = field(default_factory=list)


@contextmanager
def watch_rounds(callback: Callable[[RoundInfo], None]) -> Iterator[None]:
    """Debug hook: call ``callback(RoundInfo)`` after every round of ``generate`` inside the block."""
    _ROUND_HOOKS.append(callback)
    try:
        yield
    finally:
        _ROUND_HOOKS.remove(callback)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU), so timings are of finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Decoder:
    """State of one ``generate`` call.

    Attributes:
        target, proposer (None: plain decoding), sampling, tree (None: chains; a ``DraftTree`` or a
            ``DynamicTree``), k_max (the deepest draft position), max_new, eos (ids), vocab (ids a drafter
            may propose), gen (the sampling generator), device (the target's).
        tokens: per row, prompt + committed tokens; out: per row, the committed tokens; reasons: per row,
            ``"stop"`` / ``"length"`` once finished, else None.
        cache: the target's :class:`RaggedCache`; counts: the raw :class:`DecodeCounts`.
        layers: the proposer's ``feature_layers`` (None: it reads no features); feats: ``[B, S, F]`` target
            features by token index, made on first use.
        stable: per row, the tokens unchanged since the proposer's last call (``DecodeState.num_stable``).
    """

    target: torch.nn.Module
    proposer: Any
    sampling: SamplingParams
    tree: Any
    k_max: int
    max_new: int
    eos: frozenset[int]
    vocab: int
    gen: torch.Generator | None
    tokens: list[list[int]]
    device: torch.device = field(init=False)
    out: list[list[int]] = field(init=False)
    reasons: list[str | None] = field(init=False)
    stable: list[int] = field(init=False)
    cache: RaggedCache = field(init=False)
    counts: DecodeCounts = field(init=False)
    layers: tuple[int, ...] | None = field(init=False)
    feats: torch.Tensor | None = None
    round: int = 0
    warned_ids: bool = False  # a proposer's out-of-vocabulary ids are reported once per call

    def __post_init__(self):
        b = len(self.tokens)
        self.tokens = [list(r) for r in self.tokens]
        self.device = next(self.target.parameters()).device
        self.out, self.reasons, self.stable = [[] for _ in range(b)], [None] * b, [0] * b
        # plain decoding (no proposer) rolls nothing back: a recurrent layer's per-position states are not recorded
        self.cache = RaggedCache(self.target, b, self.device, capacity=self.capacity(), exact=attention.EXACT,
                                 rollback=self.proposer is not None, compiled=compiled.ENABLED)
        self.counts = DecodeCounts(batch_size=b, reached=[0] * self.k_max, accepted_at=[0] * self.k_max)
        self.layers = getattr(self.proposer, "feature_layers", None) if self.proposer is not None else None

    def capacity(self) -> int:
        """Token columns a row can need: its prompt and ``k_max + 1`` per emitted token at most."""
        return max(len(t) for t in self.tokens) + (self.k_max + 1) * self.max_new + 1

    @property
    def active(self) -> list[bool]:
        return [r is None for r in self.reasons]

    def last_tokens(self) -> torch.Tensor:
        """Each row's last committed token, ``[B, 1]``: the first column of a verification pass."""
        return torch.tensor([[t[-1]] for t in self.tokens], dtype=torch.long, device=self.device)


def emit(dec: Decoder, b: int, toks: list[int]) -> list[int]:
    """Append ``toks`` to row b, cut at the first EOS; set its finish reason. Returns what was emitted."""
    emitted = []
    for t in toks:
        emitted.append(t)
        if t in dec.eos:
            dec.reasons[b] = "stop"
            break
    dec.out[b] += emitted
    dec.tokens[b] += emitted
    if dec.reasons[b] is None and len(dec.out[b]) >= dec.max_new:
        dec.reasons[b] = "length"
    return emitted


def commit(dec: Decoder, b: int, accepted: list[int], bonus: int, drafted: int, judged_past: bool) -> None:
    """Commit row b's accepted draft tokens and its bonus / correction token (cut at EOS and the budget) and
    count them: ``drafted`` draft tokens verified, ``judged_past``: the target judged a draft token after the
    last accepted one (a rejection at position ``len(accepted)``, unless EOS ended the row before it)."""
    emitted = emit(dec, b, accepted + [bonus])
    stopped_early = dec.reasons[b] == "stop" and len(emitted) <= len(accepted)
    dec.counts.record_row(drafted=drafted, accepted=min(len(emitted), len(accepted)), committed=len(emitted),
                          rejected_at=len(accepted) if judged_past and not stopped_early else None)


def screen_ids(dec: Decoder, where: str, d: torch.Tensor, considered: torch.Tensor,
               effect: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The bad-token check every round shape runs on its draft tokens ``d [B, N]``: returns ``d`` with ids
    outside the target's vocabulary replaced by 0 (so the target's forward can embed them) and where they
    were (bool ``[B, N]``; the round must not verify those positions). The first time an active row's
    ``considered`` position holds one, a ``UserWarning`` names ``where`` and what is done (``effect``)."""
    bad = (d < 0) | (d >= dec.vocab)
    seen = bad & considered & torch.tensor(dec.active, device=dec.device)[:, None]
    if not dec.warned_ids and bool(seen.any()):
        dec.warned_ids = True
        ids = sorted(set(d[seen].tolist()))[:5]
        warnings.warn(f"{where} returned token ids {ids} outside [0, {dec.vocab}) (the target's vocabulary): a "
                      f"proposer contract violation. {effect} (output stays exact); fix the proposer. Warned once "
                      "per generate call", stacklevel=4)
    return d.masked_fill(bad, 0), bad


def hidden(dec: Decoder, out) -> torch.Tensor | None:
    """The target's features for the proposer: its ``feature_layers`` hidden states concatenated,
    ``[B, m, F]``, or None. Raises ``ValueError`` for a layer id the target does not have."""
    if dec.layers is None:
        return None
    hs = out.hidden_states
    bad = [i for i in dec.layers if not -len(hs) <= i < len(hs)]
    if bad:
        raise ValueError(f"drafter.feature_layers {bad} out of range: the target has {len(hs)} hidden states")
    return torch.cat([hs[i] for i in dec.layers], dim=-1)


def store_features(dec: Decoder, h: torch.Tensor, starts: list[int], counts: list[int], src: list[int]) -> None:
    """Write ``h[b, src[b]: src[b]+counts[b]]`` to the feature buffer at token index ``starts[b]``."""
    if dec.feats is None:
        dec.feats = torch.zeros(len(dec.tokens), dec.capacity(), h.shape[-1], dtype=h.dtype, device=h.device)
    for b, (s, c, o) in enumerate(zip(starts, counts, src)):
        if c:
            dec.feats[b, s: s + c] = h[b, o: o + c]


def proposer_view(dec: Decoder) -> DecodeState:
    """What the proposer sees this round (``decode.protocol.DecodeState``: ``features`` per row ``[len - 1, F]``
    or None); every row's tokens so far count as stable (``num_stable``) at its next call."""
    feats = None if dec.feats is None else [dec.feats[b, : len(t) - 1] for b, t in enumerate(dec.tokens)]
    state = DecodeState(tokens=dec.tokens, num_stable=dec.stable, features=feats, active=dec.active,
                        vocab_size=dec.vocab, num_draft_tokens=dec.k_max)
    dec.stable = [len(t) for t in dec.tokens]
    return state


def timed_proposal(dec: Decoder, method: str, width: int | None, what: str, *args) -> tuple[Any, torch.Tensor]:
    """Call ``proposer.<method>(*args)`` on the drafting clock; return the proposal and its tokens as a
    LongTensor ``[B, width]`` (``width`` None: any) on the target's device. Raises ``ValueError`` for any
    other shape."""
    t0 = time.perf_counter()
    prop = getattr(dec.proposer, method)(*args)
    sync(dec.device)
    dec.counts.draft_time_s += time.perf_counter() - t0
    b, d = len(dec.tokens), torch.as_tensor(prop.tokens)
    width = d.shape[-1] if width is None and d.dim() == 2 else width
    if d.dim() != 2 or tuple(d.shape) != (b, width) or d.is_floating_point() or d.dtype == torch.bool:
        raise ValueError(f"{type(dec.proposer).__name__}.{method} returned tokens of shape {tuple(d.shape)} "
                         f"({d.dtype}); the proposer protocol needs an integer tensor [B, {'N' if what else 'k'}] "
                         f"= [{b}, {width}]{what}")
    return prop, d.to(dec.device, torch.long)


def notify(dec: Decoder, drafts: list[list[int]] | None = None) -> None:
    """Call the :func:`watch_rounds` hooks with this round's :class:`RoundInfo`."""
    if not _ROUND_HOOKS:
        return
    c = dec.cache
    info = RoundInfo(dec.round, c.cache_length(), c.length, c.mask[:, : c.length].sum(1).tolist(),
                     c.n_real.tolist(), [list(t) for t in dec.tokens], dec.active, drafts or [[] for _ in dec.tokens])
    for hook in _ROUND_HOOKS:
        hook(info)


def prefill(dec: Decoder) -> None:
    """The prompt pass: every row's prompt through the target, its first token committed."""
    want_h = dec.layers is not None
    out = dec.cache.prefill(dec.tokens, logits_to_keep=1, output_hidden_states=want_h)
    first, _ = select_tokens(out.logits[:, -1, : dec.vocab], dec.sampling, dec.vocab, dec.gen)
    if want_h:
        p = max(len(t) for t in dec.tokens)
        lens = [len(t) for t in dec.tokens]
        store_features(dec, hidden(dec, out), [0] * len(lens), lens, [p - n for n in lens])
    for b, t in enumerate(first.tolist()):
        emit(dec, b, [t])
    dec.counts.prefill_committed = len(dec.tokens)
    notify(dec)
