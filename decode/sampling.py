"""Logits -> sampling distribution, applied identically to the target's p and the drafter's q.

Speculative sampling is exact only if the target's distribution p and the draft distribution q are
shaped by the same temperature / top-k / top-p (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with
Speculative Sampling"). The filters follow transformers' logits warpers, in their order:
temperature, then top-k (ties with the k-th logit are kept), then top-p (the smallest set of
most-likely tokens whose mass reaches ``top_p``; the most likely token is always kept).
"""

from __future__ import annotations

import torch

from drafterkit.decode.protocol import SamplingParams


def check_sampling_params(params: SamplingParams) -> None:
    """Raise ``ValueError`` naming the bad field if ``params`` cannot define a distribution."""
    if not (params.temperature >= 0.0):
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {params.temperature}")
    if int(params.top_k) != params.top_k or params.top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {params.top_k}")
    if not (0.0 < params.top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {params.top_p}")


def sanitize_logits(logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """Float32 copy of ``logits [..., V]`` made safe to sample from, without host syncs on accelerators.

    NaN -> -inf; ids ``>= vocab_size`` -> -inf; a row holding ``+inf`` becomes a uniform choice among
    its ``+inf`` entries; a row with nothing left (all -inf / NaN) becomes uniform over the ids
    ``< vocab_size``.
    """
    x = logits.float()
    if x is logits:
        x = x.clone()
    if vocab_size is not None and vocab_size < x.shape[-1]:
        x[..., vocab_size:] = float("-inf")
    # On the CPU a host sync costs nothing: when every logit is finite (the usual case) the masked
    # copy is already safe, and the six full passes below (~1 ms per round for an 11-node tree over a
    # 49k vocabulary, ~2% of a SmolLM2-135M step) are skipped.
    if x.device.type == "cpu" and bool(torch.isfinite(x[..., :vocab_size] if vocab_size else x).all()):
        return x
    x = x.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    pos_inf = x == float("inf")
    x = torch.where(pos_inf.any(-1, keepdim=True), torch.where(pos_inf, 0.0, float("-inf")), x)
    fill = torch.zeros_like(x[..., :1]).expand_as(x)
    if vocab_size is not None and vocab_size < x.shape[-1]:
        fill = torch.zeros_like(x)
        fill[..., vocab_size:] = float("-inf")
    return torch.where((x == float("-inf")).all(-1, keepdim=True), fill, x)


def mask_unproposable(logits: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """``logits [..., N]`` over a draft vocabulary with -inf where the entry may not be proposed: entry ``j`` names
    target id ``ids[j]`` (``ids [N]``, a reduced draft vocabulary as EAGLE-3's ``d2t``) or ``j`` itself (``ids``
    None), and ids ``>= vocab_size`` (the target's; padding rows of an LM head) are never drafted. Same shape and
    dtype (``logits`` itself where nothing can be masked); graph-safe (no host sync): compiled draft rounds use it."""
    n = logits.shape[-1]
    if ids is None and n <= vocab_size:
        return logits
    bad = (ids if ids is not None else torch.arange(n, device=logits.device)) >= vocab_size
    return logits.masked_fill(bad, float("-inf"))


def greedy_argmax(logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """The greedy choice of each row of ``logits [..., V]`` -> LongTensor ``[...]``: the same ids as
    ``sanitize_logits(logits, vocab_size).argmax(-1)``, reading the logits once in the usual case.

    On the CPU one ``max`` over the first ``vocab_size`` ids in the logits' own dtype (a bf16 -> fp32 conversion is
    exact, so ties and order are the same; ``max`` returns the first maximal index, as ``argmax`` does, and its
    vectorised reduction runs several times faster than ``argmax``'s on bf16 rows of a large vocabulary), then a
    finiteness check of the chosen values only: ``max`` propagates NaN and prefers ``+inf``, so a finite chosen
    value means the row held neither and :func:`sanitize_logits` would leave its order as it is. A non-finite one
    (NaN, ``+inf``, a row all ``-inf``) takes the full repair. On accelerators always the repair, without a host
    sync.
    """
    if logits.device.type == "cpu":
        x = logits if vocab_size is None or vocab_size >= logits.shape[-1] else logits[..., :vocab_size]
        values, best = x.max(-1)
        if bool(torch.isfinite(values).all()):
            return best
    return sanitize_logits(logits, vocab_size).argmax(-1)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams, vocab_size: int | None = None) -> torch.Tensor:
    """Turn logits into the decoding distribution.

    Args:
        logits: ``[..., V]`` any float dtype; NaN and ``+-inf`` are tolerated (see ``sanitize_logits``).
        params: temperature / top-k / top-p. ``temperature == 0`` gives the one-hot of the argmax.
        vocab_size: ids ``>= vocab_size`` get probability 0 (padding rows of an LM head).

    Returns:
        float32 ``[..., V]``, every row a probability vector (non-negative, sums to 1, never NaN).

    Raises:
        ValueError: invalid ``params`` (negative temperature, top_p outside (0, 1], negative top_k).
    """
    check_sampling_params(params)
    x = sanitize_logits(logits, vocab_size)
    if params.greedy:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    x = x / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, int(params.top_k), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
        drop_sorted = before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row from ``probs [..., V]`` -> LongTensor ``[...]``."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def select_tokens(logits: torch.Tensor, params: SamplingParams, vocab_size: int | None = None,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick the next token from ``logits [..., V]``: argmax when greedy, else a sample.

    Returns:
        ``(tokens [...], probs [..., V] or None)``: ``probs`` is the distribution sampled from
        (``None`` when greedy, where no distribution is needed).
    """
    if params.greedy:
        return greedy_argmax(logits, vocab_size), None
    probs = logits_to_probs(logits, params, vocab_size)
    return sample(probs, generator), probs
