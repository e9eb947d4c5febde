"""Attention for the decoder's multi-token passes (verification, tree drafting) over a GQA target.

A verification pass scores ``m > 1`` new tokens (the last committed one plus the draft tokens or tree
nodes) under an explicit mask (the tree's, ``[B, 1, m, L]``). For grouped-query attention
(``num_key_value_heads < num_attention_heads``) transformers' SDPA path then repeats every key/value
head ``g = heads / kv_heads`` times, copying the whole KV cache of every layer on every pass (SmolLM2-
135M: 9 query heads over 3 KV heads, 30 layers), because PyTorch's ``enable_gqa`` is not used with a
mask. For one query token transformers already avoids the copy by folding the ``g`` query heads of a
group into the query length. :func:`packed_gqa_sdpa` does the same for ``m`` tokens: the query heads of a
group are laid out as ``g * m`` rows against the group's single KV head, and the mask is tiled ``g``
times to match. Same arithmetic, no cache copy: on this project's 2-core CPU a bf16 verification pass
over 6 tokens at 150-350 tokens of context went from 49.8-51.8 ms to 48.3-49.7 ms; outputs are identical
in fp32 (tests/test_decode_attention.py).

:func:`verification_attention` switches a model whose attention implementation is ``"sdpa"`` to this
function for the duration of one forward and restores it after, so the same model object handed to
transformers' ``generate`` (the baseline) runs stock transformers code.

**Exact attention** (:func:`exact_sdpa`, the target's passes in ``decode.generate`` while :data:`EXACT` is
True). A CPU SDPA kernel's result for one query depends on the key axis it reduces over, not only on the
keys it may see: a verification row that sees ``L + t + 1`` keys of an ``L + m`` axis under a mask (or a tree
node whose ancestors sit between other nodes' columns) sums its softmax and its ``P @ V`` in another order
than the plain step that sees exactly those ``L + t + 1`` keys, and in bf16 that moved a committed token's
logits by an ulp often enough that 5 of 8 MT-bench texts of prompt lookup left plain decoding within 64
tokens (tests/test_decode_exact.py replays a round against plain steps and names the first tensor that
differs). Exact attention runs every query as a decoding step runs it: one query against exactly the keys it
may see, in cache order, with no mask (a slice of the cache where they are contiguous, a gathered copy where
they are not: tree nodes, rows of a ragged batch after rejections), and a prompt as one causal block over
its own tokens. So a committed token's attention is the same call whether a plain step, a chain round, a
tree round or a ragged batch computed it.

**Sliding layers**: the keys a query may see come from its layer's mask, and :class:`decode.cache.RaggedCache`
gives a sliding layer a mask that keeps only the keys inside its window by absolute position (``p - window <
q <= p``), over a full cache, so the plan here picks exactly the window's keys, in cache order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

#: Name under which :func:`packed_gqa_sdpa` is registered with transformers' attention interfaces.
NAME = "drafterkit_packed_gqa_sdpa"
#: Name under which :func:`exact_sdpa` is registered.
EXACT_NAME = "drafterkit_exact_sdpa"
#: ``decode.generate`` runs the target's passes with :func:`exact_sdpa` while True; set it with
#: ``decode.exact_mode`` (off by default: the packed verification pass is faster, ``benchmarks/exactness_cost.py``)
EXACT = False
_registered = False
# the last two masks seen and their per-query key plans (one plan serves every layer of a type; a model with
# sliding layers alternates a full and a windowed mask, decode.cache)
_plans = threading.local()


def packed_gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention with the transformers attention-function signature.

    Args:
        query: ``[B, Hq, m, D]``; key, value: ``[B, Hkv, L, D]`` (``Hq = g * Hkv``).
        attention_mask: ``[B or 1, 1, m, L]`` (bool: True = attend, or additive float), or None.

    Returns:
        ``(out [B, m, Hq, D], None)``, as transformers' ``sdpa_attention_forward``, which handles every
        case this function does not (one query token, no mask, no grouping, a per-head mask, dropout,
        attention sinks or a position bias) and is called for them unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = int(getattr(module, "num_key_value_groups", 1))
    b, hq, m, d = query.shape
    plain = (g == 1 or m == 1 or attention_mask is None or attention_mask.dim() != 4
             or attention_mask.shape[1] != 1 or attention_mask.shape[2] != m or dropout
             or any(kwargs.get(k) is not None for k in ("position_bias", "s_aux", "sinks", "softcap")))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    hkv = key.shape[1]
    q = query.reshape(b, hkv, g * m, d)  # query head h = group h // g: rows (h % g) * m + t
    mask = attention_mask.repeat(1, 1, g, 1)  # row (h % g) * m + t reads mask row t
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, hq, m, value.shape[-1]).transpose(1, 2).contiguous(), None


def _one_query(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """One query ``[1, Hq, 1, D]`` against keys/values ``[1, Hkv, n, D]``, no mask, the query heads of a
    group packed as transformers packs a decoding step's: ``[1, Hq, 1, D]``."""
    hkv, hq, d = key.shape[1], query.shape[1], query.shape[-1]
    out = torch.nn.functional.scaled_dot_product_attention(query.reshape(1, hkv, hq // hkv, d), key, value,
                                                           scale=scaling)
    return out.reshape(1, hq, 1, value.shape[-1])


def _plan(mask: torch.Tensor | None, b: int, m: int, length: int) -> list[tuple]:
    """Per row of the batch, how its queries run: ``("causal", b, t0, s, e)`` (queries ``t0..m-1`` as one
    causal block over keys ``s..e-1``, a prompt), ``("slice", b, t, s, e)`` (query t over the contiguous keys
    ``s..e-1``) or ``("gather", b, t, index)`` (over the keys at ``index``); queries that may see no key are
    left out (left padding: their output is zero)."""
    if mask is None:  # transformers drops the mask of an unpadded prompt and of an unpadded decoding step
        return [("causal", i, 0, 0, length) if m > 1 else ("slice", i, 0, 0, length) for i in range(b)]
    seen = (mask if mask.dtype == torch.bool else mask == 0)[:, 0].expand(b, m, length)  # [B, m, L]
    count = seen.sum(-1)
    first = seen.long().argmax(-1)
    last = length - 1 - seen.flip(-1).long().argmax(-1)
    contiguous = (last - first + 1 == count).tolist()
    count, first, last = count.tolist(), first.tolist(), last.tolist()
    plan = []
    for i in range(b):
        ts = [t for t in range(m) if count[i][t]]
        causal = (len(ts) > 1 and ts == list(range(ts[0], m)) and all(contiguous[i][t] for t in ts)
                  and len({first[i][t] for t in ts}) == 1 and count[i][ts[0]] == 1
                  and all(last[i][t] == last[i][ts[0]] + t - ts[0] for t in ts))
        if causal:
            plan.append(("causal", i, ts[0], first[i][ts[0]], last[i][m - 1] + 1))
            continue
        for t in ts:
            if contiguous[i][t]:
                plan.append(("slice", i, t, first[i][t], last[i][t] + 1))
            else:
                plan.append(("gather", i, t, seen[i, t].nonzero().reshape(-1)))
    return plan


def exact_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention computed as plain decoding computes it, for every query (see the module docstring).

    Args:
        query: ``[B, Hq, m, D]``; key, value: ``[B, Hkv, L, D]`` (``Hq = g * Hkv``).
        attention_mask: ``[B or 1, 1, m, L]`` (bool: True = attend, or additive float: 0 = attend), or None
            (an unpadded prompt, causal, or one unpadded decoding step).

    Returns:
        ``(out [B, m, Hq, D], None)`` as transformers' ``sdpa_attention_forward``, which runs every case
        this function does not (dropout, a per-head mask, attention sinks, a position bias, softcapping).
        Each query's output is the one-query SDPA over exactly its visible keys in cache order (a prompt's
        queries: one causal SDPA over the prompt's own tokens, as an unpadded prefill runs); a query that
        may see nothing gives zeros.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, hq, m, d = query.shape
    length = key.shape[2]
    if (dropout or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))
            or any(kwargs.get(k) is not None for k in ("position_bias", "s_aux", "sinks", "softcap"))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    recent = getattr(_plans, "recent", [])
    plan = next((c[2] for c in recent if c[0] is attention_mask and c[1] == (b, m, length)), None)
    if plan is None:
        plan = _plan(attention_mask, b, m, length)
        _plans.recent = [(attention_mask, (b, m, length), plan)] + recent[:1]
    out = query.new_zeros(b, hq, m, value.shape[-1])
    for step in plan:
        i = step[1]
        if step[0] == "causal":
            _, _, t0, s, e = step
            out[i: i + 1, :, t0:] = torch.nn.functional.scaled_dot_product_attention(
                query[i: i + 1, :, t0:], key[i: i + 1, :, s:e], value[i: i + 1, :, s:e], is_causal=True,
                scale=scaling, enable_gqa=hq != key.shape[1])
        elif step[0] == "slice":
            _, _, t, s, e = step
            out[i: i + 1, :, t: t + 1] = _one_query(query[i: i + 1, :, t: t + 1], key[i: i + 1, :, s:e],
                                                   value[i: i + 1, :, s:e], scaling)
        else:
            _, _, t, idx = step
            idx = idx.to(key.device)
            out[i: i + 1, :, t: t + 1] = _one_query(query[i: i + 1, :, t: t + 1], key[i: i + 1].index_select(2, idx),
                                                   value[i: i + 1].index_select(2, idx), scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`packed_gqa_sdpa` under :data:`NAME` and :func:`exact_sdpa` under :data:`EXACT_NAME`
    (each with SDPA's mask builder) with transformers; returns :data:`NAME`."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, packed_gqa_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        AttentionInterface.register(EXACT_NAME, exact_sdpa)
        AttentionMaskInterface.register(EXACT_NAME, sdpa_mask)
        _registered = True
    return NAME


@contextmanager
def verification_attention(model: torch.nn.Module, exact: bool = False) -> Iterator[None]:
    """Run ``model`` with :func:`packed_gqa_sdpa` (``exact``: :func:`exact_sdpa`) inside the block when it
    uses ``"sdpa"`` (and has no sub-configs); any other attention implementation (eager, flash, flex) is
    left as it is."""
    cfg = getattr(model, "config", None)
    own = getattr(cfg, "_attn_implementation", None)
    if own != "sdpa" or getattr(cfg, "sub_configs", None):
        yield
        return
    register()
    cfg._attn_implementation = EXACT_NAME if exact else NAME
    try:
        yield
    finally:
        cfg._attn_implementation = own
