"""The speculative decoding engine behind ``decode.generate`` (chain and tree drafts, batched and ragged).

Each round (Leviathan et al. 2023; Chen et al. 2023; loop shaped after pytorch-labs/gpt-fast):

    proposer.propose(state, k)            -> draft tokens d_1..d_k per row (+ q when sampling)
    ONE target forward over [last, d_1..d_k] with the KV cache   -> logits [B, k+1, V]
    verify_greedy / verify_sampling       -> n accepted + one bonus / correction token per row
    keep n+1 new cache columns per row, mask the rest, crop to the longest row

Rows of a ragged batch are left-padded; stale and padding cache columns are masked in a 2-D
attention mask and each row carries explicit RoPE positions (see ``decode.cache.RaggedCache``).
Finished rows stay in the batch as masked dummies. ``drafter=None`` runs the same loop with k = 0:
plain decoding, the honest baseline.

Tree rounds (``tree=...``; SpecInfer, Miao et al. 2024; Medusa; EAGLE) differ in three places: the
proposer fills a static :class:`decode.tree.DraftTree` (``propose_tree``); the target runs
``[last, node_0 .. node_{N-1}]`` under a 4-D tree attention mask with RoPE position = depth; and after
the accepted path is found (``verify_tree_greedy`` / ``verify_tree_sampling``) its cache columns and
hidden features are gathered into place before the same ``keep`` (decode/tree_round.py; EAGLE-2's
dynamic trees, one shape per row and round, run there too). Statistics count per depth: a
tree's ``drafted`` is the nodes verified, ``accept_per_position[i]`` the acceptance at depth ``i + 1``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from drafterkit.decode import attention
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.dynamic_tree import DynamicTree, parse_tree
from drafterkit.decode.fused import fused_projections
from drafterkit.decode.inputs import (
    AUTO,
    as_proposer,
    as_rows,
    auto_decoding,
    check_count,
    check_prompt_length,
    draft_threshold_set,
    proposer_modules,
    resolve_eos,
    shared_vocab_size,
)
from drafterkit.decode.metrics import DecodeCounts, DecodeStats, compute_stats
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.decode.sampling import (
    check_sampling_params,
    greedy_logits,
    logits_to_probs,
    select_tokens,
)
from drafterkit.decode.tree_round import TreeRounds, sync
from drafterkit.decode.verify import verify_greedy, verify_sampling

_ROUND_HOOKS: list[Callable[[RoundInfo], None]] = []


@dataclass
class GenerateResult:
    """``sequences``: new token ids per row (EOS included when emitted); ``finish_reasons``: ``"stop"``
    (EOS emitted) or ``"length"`` (``max_new_tokens`` reached); ``stats``: :class:`DecodeStats`;
    ``counts``: the raw :class:`DecodeCounts` they derive from (e.g. ``counts.reached[i]``, the
    proposals reaching draft position i, for pooling per-position acceptance exactly across calls)."""

    sequences: list[list[int]]
    finish_reasons: list[str]
    stats: DecodeStats
    counts: DecodeCounts | None = None


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


_sync = sync


class _Decoder(TreeRounds):
    """State of one ``generate`` call. Functions are split so each does one step of the round."""

    def __init__(self, target, rows, proposer, sampling, k_max, max_new, eos, vocab, generator, tree=None):
        self.target, self.proposer, self.sampling, self.tree = target, proposer, sampling, tree
        self.k_max, self.max_new, self.eos, self.vocab, self.gen = k_max, max_new, eos, vocab, generator
        self.device = next(target.parameters()).device
        self.tokens = [list(r) for r in rows]
        self.out: list[list[int]] = [[] for _ in rows]
        self.reasons: list[str | None] = [None] * len(rows)
        self.prev_len = [0] * len(rows)
        capacity = max(len(r) for r in rows) + (k_max + 1) * max_new + 1
        self.cache = RaggedCache(target, len(rows), self.device, capacity=capacity, exact=attention.EXACT)
        self.counts = DecodeCounts(batch_size=len(rows), reached=[0] * k_max, accepted_at=[0] * k_max)
        self.layers = getattr(proposer, "feature_layers", None) if proposer is not None else None
        self.feats: torch.Tensor | None = None
        self.round = 0
        self._warned_ids = False  # a proposer's out-of-vocabulary ids are reported once per call

    # --- bookkeeping -----------------------------------------------------------------------------------
    @property
    def active(self) -> list[bool]:
        return [r is None for r in self.reasons]

    def _emit(self, b: int, toks: list[int]) -> list[int]:
        """Append ``toks`` to row b, cut at the first EOS; set its finish reason. Returns what was emitted."""
        emitted = []
        for t in toks:
            emitted.append(t)
            if t in self.eos:
                self.reasons[b] = "stop"
                break
        self.out[b] += emitted
        self.tokens[b] += emitted
        if self.reasons[b] is None and len(self.out[b]) >= self.max_new:
            self.reasons[b] = "length"
        return emitted

    def _hidden(self, out) -> torch.Tensor | None:
        if self.layers is None:
            return None
        hs = out.hidden_states
        bad = [i for i in self.layers if not -len(hs) <= i < len(hs)]
        if bad:
            raise ValueError(f"drafter.feature_layers {bad} out of range: the target has {len(hs)} hidden states")
        return torch.cat([hs[i] for i in self.layers], dim=-1)

    def _store_features(self, h: torch.Tensor, starts: list[int], counts: list[int], src: list[int]) -> None:
        """Write ``h[b, src[b]: src[b]+counts[b]]`` to the feature buffer at token index ``starts[b]``."""
        if self.feats is None:
            size = max(len(t) for t in self.tokens) + (self.k_max + 1) * self.max_new + 1
            self.feats = torch.zeros(len(self.tokens), size, h.shape[-1], dtype=h.dtype, device=h.device)
        for b, (s, c, o) in enumerate(zip(starts, counts, src)):
            if c:
                self.feats[b, s: s + c] = h[b, o: o + c]

    def _state(self) -> DecodeState:
        feats = None if self.feats is None else [self.feats[b, : len(t) - 1] for b, t in enumerate(self.tokens)]
        state = DecodeState(tokens=self.tokens, num_stable=self.prev_len, features=feats, active=self.active,
                            vocab_size=self.vocab)
        self.prev_len = [len(t) for t in self.tokens]
        return state

    def _notify(self, drafts: list[list[int]] | None = None) -> None:
        if not _ROUND_HOOKS:
            return
        c = self.cache
        info = RoundInfo(self.round, c.cache.get_seq_length(), c.length, c.mask[:, : c.length].sum(1).tolist(),
                         c.n_real.tolist(), [list(t) for t in self.tokens], self.active,
                         drafts or [[] for _ in self.tokens])
        for hook in _ROUND_HOOKS:
            hook(info)

    # --- the two passes ------------------------------------------------------------------------------
    def prefill(self) -> None:
        want_h = self.layers is not None
        out = self.cache.prefill(self.tokens, logits_to_keep=1, output_hidden_states=want_h)
        first, _ = select_tokens(out.logits[:, -1, : self.vocab], self.sampling, self.vocab, self.gen)
        if want_h:
            p = max(len(t) for t in self.tokens)
            lens = [len(t) for t in self.tokens]
            self._store_features(self._hidden(out), [0] * len(lens), lens, [p - n for n in lens])
        for b, t in enumerate(first.tolist()):
            self._emit(b, [t])
        self.counts.prefill_committed = len(self.tokens)
        self._notify()

    def _timed_proposal(self, method: str, width: int | None, what: str, *args) -> tuple[Any, torch.Tensor]:
        """Call ``proposer.<method>(*args)`` on the drafting clock; return the proposal and its tokens as
        a LongTensor ``[B, width]`` (``width`` None: any) on the target's device. Raises ``ValueError`` for
        any other shape."""
        t0 = time.perf_counter()
        prop = getattr(self.proposer, method)(*args)
        _sync(self.device)
        self.counts.draft_time_s += time.perf_counter() - t0
        b, d = len(self.tokens), torch.as_tensor(prop.tokens)
        width = d.shape[-1] if width is None and d.dim() == 2 else width
        if d.dim() != 2 or tuple(d.shape) != (b, width) or d.is_floating_point() or d.dtype == torch.bool:
            raise ValueError(f"{type(self.proposer).__name__}.{method} returned tokens of shape {tuple(d.shape)} "
                             f"({d.dtype}); the proposer protocol needs an integer tensor [B, {'N' if what else 'k'}] "
                             f"= [{b}, {width}]{what}")
        return prop, d.to(self.device, torch.long)

    def _propose(self, k: int, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Draft tokens ``[B, k]`` (invalid ids replaced by 0), q ``[B, k, V]`` or None, and the limit
        cut at each row's first invalid id."""
        b = len(self.tokens)
        if k == 0:
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), None, limit
        prop, d = self._timed_proposal("propose", k, "", self._state(), k, self.sampling, self.gen)
        name = type(self.proposer).__name__
        q = None if prop.probs is None or self.sampling.greedy else prop.probs
        if q is not None and (q.dim() != 3 or tuple(q.shape[:2]) != (b, k)):
            raise ValueError(f"{name}.propose returned probs of shape {tuple(q.shape)}; the proposer protocol "
                             f"needs [B, k, V] = [{b}, {k}, V] or None")
        bad = (d < 0) | (d >= self.vocab)
        any_bad = bad.any(1)
        seen = bad & torch.tensor(self.active, device=self.device)[:, None]  # finished rows may hold anything
        if not self._warned_ids and bool(seen.any()):
            self._warned_ids = True
            ids = sorted(set(d[seen].tolist()))[:5]
            warnings.warn(f"{name}.propose returned token ids {ids} outside [0, {self.vocab}) (the target's "
                          "vocabulary): a proposer contract violation. Each such chain is cut before the bad "
                          "id (output stays exact, acceptance drops); fix the proposer. Warned once per "
                          "generate call", stacklevel=2)
        first_bad = torch.where(any_bad, bad.long().argmax(1), torch.full_like(limit, k))
        limit = torch.minimum(limit, first_bad)
        if prop.lengths is not None:
            lengths = torch.as_tensor(prop.lengths).to(self.device, torch.long).reshape(-1)
            if lengths.numel() != b:
                raise ValueError(f"{name}.propose returned lengths of shape {tuple(lengths.shape)}; need [B] = [{b}]")
            limit = torch.minimum(limit, lengths.clamp(0, k))
        q = None if q is None else q.to(self.device)
        return d.masked_fill(bad, 0), q, limit

    def step(self) -> None:
        """One round: propose, ONE target forward over ``[last, d_1..d_k]``, verify, commit."""
        active = self.active
        remaining = [self.max_new - len(o) for o in self.out]
        k = 0 if self.proposer is None else min(self.k_max, max(r for r, a in zip(remaining, active) if a) - 1)
        limit = torch.tensor([min(k, r - 1) if a else 0 for r, a in zip(remaining, active)], device=self.device)
        d, q, limit = self._propose(k, limit)
        if k:
            # Verify only as far as some active row can accept: draft tokens past every row's limit
            # (no match, invalid id, remaining budget) would cost target compute for nothing.
            k = max(lim for lim, a in zip(limit.tolist(), active) if a)
            d, q = d[:, :k], None if q is None else q[:, :k]
        t0 = time.perf_counter()
        last = torch.tensor([[t[-1]] for t in self.tokens], dtype=torch.long, device=self.device)
        n_real_before = self.cache.n_real.tolist()
        out = self.cache.run(torch.cat([last, d], 1), logits_to_keep=k + 1,
                             output_hidden_states=self.layers is not None)
        logits = out.logits[..., : self.vocab]  # [B, k+1, V]
        if self.sampling.greedy:
            n, nxt = verify_greedy(greedy_logits(logits), d, limit)
        else:
            n, nxt = verify_sampling(logits_to_probs(logits, self.sampling), q, d, self.gen, limit)
        act = torch.tensor(active, device=self.device)
        valid = torch.where(act, n + 1, 0)
        host = torch.cat([n[:, None], nxt[:, None], limit[:, None], d], 1).tolist()
        self.cache.keep(valid, valid_max=max(h[0] + 1 if a else 0 for h, a in zip(host, active)))
        if self.layers is not None:
            cnt = [h[0] + 1 if a else 0 for h, a in zip(host, active)]
            self._store_features(self._hidden(out), n_real_before, cnt, [0] * len(cnt))
        for b, (row, a) in enumerate(zip(host, active)):
            if a:
                self._commit(b, row, k)
        _sync(self.device)
        self.counts.verify_time_s += time.perf_counter() - t0
        self.round += 1
        if _ROUND_HOOKS:  # the drafts each row had verified, for watch_rounds hooks only
            self._notify([h[3: 3 + min(k, max(h[2], 0))] if a else [] for h, a in zip(host, active)])

    def _commit(self, b: int, row: list[int], k: int) -> None:
        n_acc, nxt, lim, drafts = row[0], row[1], row[2], row[3: 3 + k]
        emitted = self._emit(b, drafts[:n_acc] + [nxt])
        accepted = min(len(emitted), n_acc)
        stopped_early = self.reasons[b] == "stop" and len(emitted) <= n_acc
        rejected_at = n_acc if n_acc < lim and not stopped_early else None
        self.counts.record_row(drafted=min(k, lim) if lim >= 0 else 0, accepted=accepted,
                               committed=len(emitted), rejected_at=rejected_at)


def generate(target: torch.nn.Module, input_ids: torch.Tensor | list[list[int]], *, drafter: Any = None,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             num_draft_tokens: int = 5, tree: Any = None, eos_token_id: int | list[int] | None = None,
             seed: int | None = None) -> GenerateResult:
    """Speculative (or, with ``drafter=None``, plain) decoding of a frozen target. See
    docs/evaluation.md and decode/metrics.py; algorithm: Leviathan et al. 2023, Chen et al. 2023 (chain drafts).

    Args:
        target: a transformers causal LM (frozen, eval mode).
        input_ids: LongTensor ``[B, T]`` (no padding) or a list of token-id lists (ragged batch).
        drafter: ``None``; a ``drafters.Drafter``; a transformers causal LM sharing the target's
            tokenizer (wrapped as ``decode.draft_model.DraftModel``); or any ``decode.protocol.Proposer``.
        max_new_tokens: the most tokens emitted per row (an int >= 1; a bool is refused). A prompt
            longer than the target's ``max_position_embeddings - max_new_tokens`` gives a
            ``UserWarning`` (decoding still runs, as in transformers; output past the trained
            context is unreliable).
        temperature, top_k, top_p: the decoding distribution; ``temperature == 0`` is greedy.
        num_draft_tokens: K, the chain length proposed per round (clamped to the remaining budget).
        tree: ``None`` for chain drafts, or a static draft tree (:class:`decode.tree.DraftTree`, or
            anything ``DraftTree.parse`` takes: ``"3,2,1"`` branching factors per depth, or a list of
            rank paths such as ``[[0], [1], [0, 0]]``). Each round the drafter proposes one token per
            node (its top-k), the target verifies the whole tree in ONE forward under tree attention
            and the longest agreeing path is accepted (SpecInfer; Medusa; EAGLE). Or a dynamic tree,
            ``"dynamic"`` / ``"dynamic:TOTAL[:DEPTH[:TOPK]]"`` (:class:`decode.dynamic_tree.DynamicTree`;
            EAGLE-2, Li et al. 2024): each row's tree is grown every round from the drafter's cumulative
            log-probabilities (top-TOPK expansion for DEPTH levels, the best TOTAL nodes verified),
            verified the same way. ``num_draft_tokens`` is then unused; depth is capped by the
            remaining budget. Or ``"auto"``: the chain / tree / ``draft_threshold`` that ``drafterkit
            tune`` measured fastest at batch size 1 on this machine, carried by a drafter loaded with
            ``drafters.load_drafter`` (``tuned_decoding``; ``decode.inputs.auto_decoding``); without
            one a chain of ``num_draft_tokens``, with a ``UserWarning`` saying why. Ignored with
            ``drafter=None``.
        eos_token_id: an int or a list of ints in ``[0, vocab)`` (``[]``: no EOS, stop on length only);
            ``None`` = the target's ``generation_config.eos_token_id``.
        seed: seeds the ``torch.Generator`` used for all sampling (draft and target).

    Returns:
        :class:`GenerateResult` (``sequences`` hold only NEW tokens; EOS included when emitted).

    Raises:
        ValueError: bad sizes (``max_new_tokens`` / ``num_draft_tokens`` not an int >= 1) or sampling
            params, token ids (``input_ids``, ``eos_token_id``) outside the vocabulary or not ints, a
            drafter whose vocabulary / tokenizer does not match the target (all checked before any
            token is generated), a proposer returning tokens of a shape other than ``[B, k]`` (``[B, N]``
            for a tree), a malformed ``tree``, or a ``tree`` with a drafter that cannot propose one.
        TypeError: ``drafter`` is none of the accepted kinds.
    """
    max_new_tokens = check_count("max_new_tokens", max_new_tokens)
    num_draft_tokens = check_count("num_draft_tokens", num_draft_tokens)
    sampling = SamplingParams(float(temperature), int(top_k), float(top_p))
    check_sampling_params(sampling)
    rows = as_rows(input_ids)
    proposer = as_proposer(drafter)
    vocab = shared_vocab_size(target, proposer)
    if proposer is not None:
        proposer.check_compatible(target, vocab)
    bad = [t for r in rows for t in r if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"input_ids hold token ids {sorted(set(bad))[:5]} outside the vocabulary [0, {vocab}); "
                         "tokenize with the target's tokenizer")
    eos = resolve_eos(target, eos_token_id, vocab)
    check_prompt_length(target, rows, max_new_tokens)
    device = next(target.parameters()).device
    gen = None if seed is None else torch.Generator(device=device).manual_seed(int(seed))
    threshold = None
    if isinstance(tree, str) and tree.strip() == AUTO:
        tree, num_draft_tokens, threshold = auto_decoding(proposer, num_draft_tokens)
    draft_tree = None
    if tree is not None and proposer is not None:
        draft_tree = parse_tree(tree)
        if isinstance(draft_tree, DynamicTree):
            if not callable(getattr(proposer, "propose_dynamic_tree", None)):
                raise ValueError(f"dynamic trees need a drafter that grows its tree (propose_dynamic_tree: every "
                                 f"drafters/ kind has it); {getattr(proposer, 'kind', type(proposer).__name__)} "
                                 "cannot: give a static tree such as '3,2,1' or tree=None")
        elif max(draft_tree.ranks) >= vocab:
            raise ValueError(f"tree rank {max(draft_tree.ranks)} needs more candidates than the vocabulary has "
                             f"({vocab} tokens): use ranks below it")
        elif not callable(getattr(proposer, "propose_tree", None)):
            raise ValueError(f"tree drafts need a drafter that can propose a tree (propose_tree: every "
                             f"drafters/ kind has it); {getattr(proposer, 'kind', type(proposer).__name__)} "
                             "proposes chains only: pass tree=None")
    k_max = (draft_tree.max_depth if draft_tree is not None else num_draft_tokens) if proposer is not None else 0
    # inference mode, not only no_grad: no autograd bookkeeping (version counters, view tracking) on the
    # ~1,000 small ops of a round; on this project's CPU that made plain and speculative decoding
    # alike ~5% faster in an A/B against no_grad. Tensors made here cannot be saved for backward.
    # fused_projections: the target's and the drafter's linear layers from the engine's merged (q/k/v,
    # gate/up) and, in bf16 on a CPU, prepacked weight copies (decode/fused.py)
    with torch.inference_mode(), fused_projections(target, *proposer_modules(proposer)), \
            draft_threshold_set(proposer, threshold):
        dec = _Decoder(target, rows, proposer, sampling, k_max, max_new_tokens, eos, vocab, gen, draft_tree)
        if proposer is not None:
            proposer.reset(len(rows))
        t0 = time.perf_counter()
        dec.prefill()
        _sync(device)
        dec.counts.ttft_s = time.perf_counter() - t0
        while any(dec.active):
            dec.step() if draft_tree is None else dec.step_tree()
        dec.counts.total_time_s = time.perf_counter() - t0
    return GenerateResult(dec.out, [r or "length" for r in dec.reasons], compute_stats(dec.counts), dec.counts)
