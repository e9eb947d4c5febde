"""Speculative decoding in one short file: batch 1, greedy, chain drafts. Read this first.

One round (Leviathan et al. 2023; Chen et al. 2023; shaped after pytorch-labs/gpt-fast's
``speculative_decode``)::

    draft    the drafter proposes k tokens d_1..d_k after the committed tokens
    verify   ONE target forward over [last, d_1..d_k] (k+1 positions) gives the target's own greedy
             choice after each of them: pred[0..k]
    accept   the longest prefix with d_i == pred[i-1] (n tokens), then pred[n]: the bonus token when
             all k were accepted, the correction token otherwise
    crop     the target's KV cache keeps the columns of last, d_1..d_n; d_{n+1}..d_k are dropped

At temperature 0 the output is exactly the target's plain greedy decoding, whatever the drafter proposes.
``decode.generate`` (``decode/engine.py``, ``decode/chain_round.py``) runs the same round with batches,
ragged rows, sampling, trees, stop handling and statistics; ``tests/test_decode_reference.py`` checks that
the two emit the same tokens and accept the same draft tokens. The drafter is any ``decode.protocol.Proposer``
(every ``drafters/`` kind is one); a drafter that reads the target's hidden states (``feature_layers``, EAGLE,
EAGLE-3, Medusa, ...) gets them through ``DecodeState.features``, one row per position the target has processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from drafterkit.decode.cache import CACHE_ARG
from drafterkit.decode.protocol import DecodeState, Proposer, SamplingParams


@dataclass
class ReferenceResult:
    """``tokens``: the new tokens; per verification round, ``drafted`` (draft tokens verified) and
    ``accepted`` (draft tokens accepted, the bonus token excluded)."""

    tokens: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)


def _features(out, layers: tuple[int, ...] | None) -> torch.Tensor | None:
    """The target's hidden states at ``layers`` concatenated, ``[T, F]`` (None: the drafter reads none)."""
    return None if layers is None else torch.cat([out.hidden_states[i][0] for i in layers], -1)


def reference_round(target: torch.nn.Module, drafter: Proposer, tokens: list[int], cache: DynamicCache,
                    feats: torch.Tensor | None, num_stable: int,
                    k: int) -> tuple[list[int], int, int, torch.Tensor | None]:
    """One greedy chain round. ``tokens``: prompt + committed tokens, the last not yet through the target;
    ``cache``: the target's KV cache over ``tokens[:-1]``; ``feats``: ``[len(tokens) - 1, F]`` or None;
    ``num_stable``: ``len(tokens)`` at the drafter's previous call (0 on the first).
    Returns ``(draft tokens verified, n accepted, bonus / correction token, features [n + 1, F] of the kept
    positions or None)``; the cache then holds ``tokens + draft[:n]``."""
    vocab = target.config.vocab_size
    draft: list[int] = []
    if k:  # 1. draft: up to k tokens (a proposal's `lengths` may say fewer, e.g. no n-gram match)
        state = DecodeState(tokens=[tokens], num_stable=[num_stable], active=[True], vocab_size=vocab,
                            features=None if feats is None else [feats], num_draft_tokens=k)
        prop = drafter.propose(state, k, SamplingParams(), None)
        n_proposed = k if prop.lengths is None else int(prop.lengths[0])
        draft = torch.as_tensor(prop.tokens)[0, :n_proposed].tolist()
    # 2. verify: one target forward over [last, d_1..d_k]; pred[i] is the target's choice after position i
    ids = torch.tensor([[tokens[-1], *draft]])
    out = target(ids, use_cache=True, **{CACHE_ARG: cache}, output_hidden_states=feats is not None)
    pred = out.logits[0, :, :vocab].argmax(-1).tolist()  # [k+1]: logits [1, k+1, V], padding rows past vocab cut
    # 3. accept the longest agreeing prefix, then the target's own next token
    n = 0
    while n < len(draft) and draft[n] == pred[n]:
        n += 1
    # 4. crop the cache to the kept positions: the old ones, `last` and the n accepted draft tokens
    if n < len(draft):
        cache.crop(n - len(draft))  # a negative count: drop that many columns from the end
    new_feats = _features(out, getattr(drafter, "feature_layers", None))
    return draft, n, pred[n], None if new_feats is None else new_feats[: n + 1]


@torch.inference_mode()
def reference_generate(target: torch.nn.Module, drafter: Proposer, input_ids: list[int], max_new_tokens: int,
                       k: int, eos_token_id: int | None = None) -> ReferenceResult:
    """Greedy speculative decoding of one prompt (``input_ids``: a list of token ids) with chains of ``k`` draft
    tokens; at most ``max_new_tokens`` new tokens, stopping after ``eos_token_id`` (None: on length only).
    ``decode.generate(target, [input_ids], drafter=drafter, max_new_tokens=..., num_draft_tokens=k,
    eos_token_id=...)`` gives the same tokens and counts."""
    layers, vocab = getattr(drafter, "feature_layers", None), target.config.vocab_size
    drafter.check_compatible(target, vocab)
    drafter.reset(1)
    cache = DynamicCache(config=target.config)
    out = target(torch.tensor([input_ids]), use_cache=True, **{CACHE_ARG: cache},
                 output_hidden_states=layers is not None)  # prefill: the first token comes from the prompt pass
    tokens, res = [*input_ids, int(out.logits[0, -1, :vocab].argmax())], ReferenceResult()
    res.tokens.append(tokens[-1])
    feats, num_stable = _features(out, layers), 0
    while len(res.tokens) < max_new_tokens and res.tokens[-1] != eos_token_id:
        k_round = min(k, max_new_tokens - len(res.tokens) - 1)  # the bonus token must fit the budget too
        draft, n, bonus, kept = reference_round(target, drafter, tokens, cache, feats, num_stable, k_round)
        num_stable = len(tokens) if k_round else num_stable  # what the drafter saw stays unchanged
        new = draft[:n] + [bonus]
        if eos_token_id in new:  # nothing after EOS is emitted
            new = new[: new.index(eos_token_id) + 1]
        res.drafted.append(len(draft))
        res.accepted.append(min(n, len(new)))
        tokens += new
        res.tokens += new
        if kept is not None:
            feats = torch.cat([feats, kept], 0)
    return res
