"""The chain round of the decoding engine (Leviathan et al. 2023; Chen et al. 2023; shaped after
pytorch-labs/gpt-fast's ``speculative_decode``):

    proposer.propose(state, k)            -> draft tokens d_1..d_k per row (+ q when sampling)
    ONE target forward over [last, d_1..d_k] with the KV cache   -> logits [B, k+1, V]
    verify_greedy / verify_sampling       -> n accepted + one bonus / correction token per row
    keep n+1 new cache columns per row, mask the rest, crop to the longest row; commit

With no proposer (``k = 0``) the same round is a plain decoding step: the honest baseline.
"""

from __future__ import annotations

import time

import torch

from drafterkit.decode.decoder import (
    Decoder,
    commit,
    hidden,
    notify,
    proposer_view,
    screen_ids,
    store_features,
    sync,
    timed_proposal,
)
from drafterkit.decode.sampling import logits_to_probs
from drafterkit.decode.verify import verify_greedy, verify_sampling


def propose_chain(dec: Decoder, k: int, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Draft tokens ``[B, k]`` (ids outside the vocabulary replaced by 0), q ``[B, k, V]`` or None, and
    ``limit [B]`` (the draft tokens each row may have verified) cut at each row's first invalid id and at the
    proposal's ``lengths``. Raises ``ValueError`` for a proposal of another shape."""
    b = len(dec.tokens)
    if k == 0:
        return torch.zeros(b, 0, dtype=torch.long, device=dec.device), None, limit
    prop, d = timed_proposal(dec, "propose", k, "", proposer_view(dec), k, dec.sampling, dec.gen)
    name = type(dec.proposer).__name__
    q = None if prop.probs is None or dec.sampling.greedy else prop.probs
    if q is not None and (q.dim() != 3 or tuple(q.shape[:2]) != (b, k)):
        raise ValueError(f"{name}.propose returned probs of shape {tuple(q.shape)}; the proposer protocol "
                         f"needs [B, k, V] = [{b}, {k}, V] or None")
    d, bad = screen_ids(dec, f"{name}.propose", d, torch.ones_like(d, dtype=torch.bool),
                        "Each such chain is cut before the bad id")
    first_bad = torch.where(bad.any(1), bad.long().argmax(1), torch.full_like(limit, k))
    limit = torch.minimum(limit, first_bad)
    if prop.lengths is not None:
        lengths = torch.as_tensor(prop.lengths).to(dec.device, torch.long).reshape(-1)
        if lengths.numel() != b:
            raise ValueError(f"{name}.propose returned lengths of shape {tuple(lengths.shape)}; need [B] = [{b}]")
        limit = torch.minimum(limit, lengths.clamp(0, k))
    return d, None if q is None else q.to(dec.device), limit


def chain_round(dec: Decoder) -> None:
    """One chain round: propose, ONE target forward over ``[last, d_1..d_k]``, verify, commit."""
    active = dec.active
    remaining = [dec.max_new - len(o) for o in dec.out]
    k = 0 if dec.proposer is None else min(dec.k_max, max(r for r, a in zip(remaining, active) if a) - 1)
    limit = torch.tensor([min(k, r - 1) if a else 0 for r, a in zip(remaining, active)], device=dec.device)
    d, q, limit = propose_chain(dec, k, limit)
    if k:
        # Verify only as far as some active row can accept: draft tokens past every row's limit
        # (no match, invalid id, remaining budget) would cost target compute for nothing.
        k = max(lim for lim, a in zip(limit.tolist(), active) if a)
        d, q = d[:, :k], None if q is None else q[:, :k]
    t0 = time.perf_counter()
    n_real_before = dec.cache.n_real.tolist()
    out = dec.cache.run(torch.cat([dec.last_tokens(), d], 1), logits_to_keep=k + 1,
                        output_hidden_states=dec.layers is not None)
    logits = out.logits[..., : dec.vocab]  # [B, k+1, V]
    if dec.sampling.greedy:
        n, nxt = verify_greedy(logits, d, limit)
    else:
        n, nxt = verify_sampling(logits_to_probs(logits, dec.sampling), q, d, dec.gen, limit)
    n_acc, bonus, lims, drafts = n.tolist(), nxt.tolist(), limit.tolist(), d.tolist()
    kept = [n_acc[b] + 1 if a else 0 for b, a in enumerate(active)]  # new cache columns each row keeps
    dec.cache.keep(torch.tensor(kept, device=dec.device), valid_max=max(kept))
    if dec.layers is not None:
        store_features(dec, hidden(dec, out), n_real_before, kept, [0] * len(kept))
    for b, a in enumerate(active):
        if a:
            commit(dec, b, drafts[b][: n_acc[b]], bonus[b], drafted=min(k, max(lims[b], 0)),
                   judged_past=n_acc[b] < lims[b])
    sync(dec.device)
    dec.counts.verify_time_s += time.perf_counter() - t0
    dec.round += 1
    notify(dec, [drafts[b][: min(k, max(lims[b], 0))] if a else [] for b, a in enumerate(active)])
