"""Verification of a chain of draft tokens against the target: greedy and exact rejection sampling.

One verification pass scores ``[last committed token, d_1 .. d_K]``; position ``i`` of its output
predicts the token after ``d_i`` (position 0 predicts ``d_1``). Both functions return how many
leading draft tokens are accepted and the one extra token the target commits after them: the
correction token at the first rejected position, or the bonus token from position K (or from the
row's ``limit``) when every considered draft token is accepted.

Sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: accept ``d_i`` with
probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection sample from
``normalize(max(0, p_i - q_i))``; after K acceptances sample the bonus token from ``p_K``. The
committed tokens are then distributed exactly as ``p``, whatever ``q`` is.
"""

from __future__ import annotations

import torch

from drafterkit.decode.sampling import greedy_argmax, sample


def _check_shapes(scores: torch.Tensor, draft_tokens: torch.Tensor, name: str) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or scores.dim() != 3:
        raise ValueError(f"{name} must be [B, K+1, V] and draft_tokens [B, K]; got {tuple(scores.shape)} "
                         f"and {tuple(draft_tokens.shape)}")
    b, k = draft_tokens.shape
    if scores.shape[0] != b or scores.shape[1] != k + 1:
        raise ValueError(f"{name} {tuple(scores.shape)} does not match draft_tokens {tuple(draft_tokens.shape)}: "
                         f"need [B, K+1, V] = [{b}, {k + 1}, V]")
    return b, k


def _leading_accepts(accept: torch.Tensor, limit: torch.Tensor | None) -> torch.Tensor:
    """``accept [B, K]`` bool -> number of leading True per row, capped at ``limit [B]``."""
    n = accept.long().cumprod(-1).sum(-1)
    return n if limit is None else torch.minimum(n, limit.to(n))


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  limit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept draft tokens while they equal the target's argmax.

    Args:
        target_logits: ``[B, K+1, V]`` target logits over ``[last token, d_1..d_K]`` (already
            masked beyond the real vocabulary by the caller if needed; NaN and ``+inf`` are repaired as
            ``decode.sampling.sanitize_logits`` does).
        draft_tokens: LongTensor ``[B, K]``.
        limit: optional LongTensor ``[B]``: consider only the first ``limit[b]`` draft tokens of row b
            (the rest are ignored; the bonus then comes from position ``limit[b]``).

    Returns:
        ``(num_accepted [B], next_token [B])``: ``next_token`` is the target's argmax at position
        ``num_accepted``, so the committed tokens ``d_1..d_n, next`` equal plain greedy decoding.

    Raises:
        ValueError: on mismatched shapes.
    """
    _check_shapes(target_logits, draft_tokens, "target_logits")
    best = greedy_argmax(target_logits)  # [B, K+1]; NaN / +inf rows as decode.sampling.sanitize_logits repairs them
    n = _leading_accepts(draft_tokens == best[:, :-1], limit)
    return n, best.gather(1, n[:, None]).squeeze(1)


def verify_sampling(p: torch.Tensor, q: torch.Tensor | None, draft_tokens: torch.Tensor,
                    generator: torch.Generator | None = None,
                    limit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact speculative sampling (rejection sampling) for a chain of draft tokens.

    Args:
        p: ``[B, K+1, V]`` target distributions (after temperature / top-k / top-p).
        q: ``[B, K, V]`` the draft distributions the draft tokens were sampled from, or ``None`` for a
            deterministic proposer (one-hot q: accept ``d_i`` with probability ``p_i(d_i)``). Rows of q
            that are not a valid distribution containing their draft token (NaN, negative, or
            ``q(d_i) == 0``) are treated as one-hot, which keeps the output exact.
        draft_tokens: LongTensor ``[B, K]``.
        generator: source of randomness (uniforms and the correction / bonus samples).
        limit: optional LongTensor ``[B]`` as in :func:`verify_greedy`.

    Returns:
        ``(num_accepted [B], next_token [B])``.

    Raises:
        ValueError: on mismatched shapes.
    """
    b, k = _check_shapes(p, draft_tokens, "p")
    p = p.float()
    q1 = torch.zeros(b, k, p.shape[-1], dtype=p.dtype, device=p.device).scatter_(-1, draft_tokens[..., None], 1.0)
    if q is not None:
        if q.shape[:2] != (b, k):
            raise ValueError(f"q {tuple(q.shape)} does not match draft_tokens {tuple(draft_tokens.shape)}")
        q = q[..., : p.shape[-1]].float()
        if q.shape[-1] < p.shape[-1]:
            q = torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))
        q_d = q.gather(-1, draft_tokens[..., None])
        ok = torch.isfinite(q).all(-1, keepdim=True) & (q >= 0).all(-1, keepdim=True) & (q_d > 0)
        q = torch.where(ok, q, q1)
    else:
        q = q1
    p_d = p[:, :-1].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    q_d = q.gather(-1, draft_tokens[..., None]).squeeze(-1)
    r = torch.rand(b, k, generator=generator, device=p.device)
    n = _leading_accepts(r * q_d < p_d, limit)  # accept w.p. min(1, p/q); p_d == 0 never accepted
    rejected = n < (k if limit is None else limit.to(n))
    p_n = p.gather(1, n[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)  # [B, V]
    q_n = q.gather(1, n.clamp(max=max(k - 1, 0))[:, None, None].expand(-1, 1, q.shape[-1])).squeeze(1) if k else p_n
    residual = (p_n - q_n).clamp(min=0.0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    dist = torch.where(rejected[:, None], residual, p_n)
    return n, sample(dist, generator)


# --------------------------------------------------------------------------------------------------
# trees


def _check_tree(scores: torch.Tensor, tree, draft_tokens: torch.Tensor, valid: torch.Tensor | None, name: str):
    """Shapes checked; returns ``(tokens, ok, per-row trees)`` as lists (a per-row tree list's rows hold
    ``trees[b].num_nodes <= N`` nodes in their first columns; ``None``: no node)."""
    b = draft_tokens.shape[0]
    per_row = isinstance(tree, (list, tuple))
    rows = list(tree) if per_row else [tree] * b
    n = tree.num_nodes if not per_row else (draft_tokens.shape[-1] if draft_tokens.dim() == 2 else -1)
    if draft_tokens.dim() != 2 or draft_tokens.shape[1] != n or scores.dim() != 3 or scores.shape[:2] != (b, n + 1):
        raise ValueError(f"{name} must be [B, N+1, V] and draft_tokens [B, N] for a tree of N={n} nodes; got "
                         f"{tuple(scores.shape)} and {tuple(draft_tokens.shape)}")
    if len(rows) != b or any(t is not None and t.num_nodes > n for t in rows):
        raise ValueError(f"per-row trees must be one per row ({b}), each of at most N={n} nodes")
    if valid is not None and tuple(valid.shape) != (b, n):
        raise ValueError(f"valid must be [B, N] = [{b}, {n}], got {tuple(valid.shape)}")
    ok = [[True] * n for _ in range(b)] if valid is None else valid.bool().tolist()
    return draft_tokens.tolist(), ok, rows


def _kids(tree, node: int) -> tuple[int, ...]:
    return () if tree is None else tree.children[node]


def verify_tree_greedy(target_logits: torch.Tensor, tree, draft_tokens: torch.Tensor,
                       valid: torch.Tensor | None = None) -> tuple[list[list[int]], list[int]]:
    """Greedy verification of a draft tree: from the root, follow the child whose token is the target's
    argmax until none is (SpecInfer, Miao et al. 2024; Medusa; EAGLE).

    Args:
        target_logits: ``[B, N+1, V]`` over ``[root, node_0 .. node_{N-1}]`` (tree attention).
        tree: the :class:`decode.tree.DraftTree` (``children`` in rank order), or one per row (a list;
            ``None`` for a row with no node): the trees of a dynamic tree round, row ``b``'s nodes in
            the first ``trees[b].num_nodes`` columns.
        draft_tokens: LongTensor ``[B, N]``, the token of each node.
        valid: optional bool ``[B, N]``; invalid nodes are never accepted (close it under parents).

    Returns:
        ``(paths, next_tokens)``: per row the accepted node indices from depth 1 down, and the target's
        argmax after the last accepted node (the bonus / correction token). The committed tokens equal
        plain greedy decoding.

    Raises:
        ValueError: on mismatched shapes.
    """
    toks, ok, trees = _check_tree(target_logits, tree, draft_tokens, valid, "target_logits")
    best = greedy_argmax(target_logits).tolist()
    paths, nxt = [], []
    for b in range(len(toks)):
        node, path = -1, []
        while True:
            t = best[b][node + 1]
            child = next((c for c in _kids(trees[b], node) if ok[b][c] and toks[b][c] == t), None)
            if child is None:
                break
            path.append(child)
            node = child
        paths.append(path)
        nxt.append(t)
    return paths, nxt


def verify_tree_sampling(p: torch.Tensor, tree, draft_tokens: torch.Tensor, valid: torch.Tensor | None = None,
                         generator: torch.Generator | None = None) -> tuple[list[list[int]], list[int]]:
    """Exact speculative sampling over a tree of DETERMINISTIC candidates (the drafter's top-k tokens).

    At each node, its valid children are tried in rank order, each as a one-hot proposal: child token
    ``c`` is accepted with probability ``r(c)``, where ``r`` starts as the target's ``p`` at the node and,
    after each rejection, becomes ``normalize(r with r(c) = 0)`` (the residual ``max(0, r - onehot(c))``
    of one-hot rejection sampling). If every child is rejected the correction token is sampled from the
    final ``r``; after a leaf the bonus token is sampled from ``p`` there. Each step is Leviathan et al.'s
    rejection sampling with a one-hot q, so every committed token is distributed exactly as ``p``
    (the multi-candidate scheme of SpecInfer, Miao et al. 2024, with deterministic drafts).

    Args:
        p: ``[B, N+1, V]`` target distributions (after temperature / top-k / top-p) over
            ``[root, node_0 ..]``.
        tree, draft_tokens, valid: as in :func:`verify_tree_greedy`.
        generator: source of randomness.

    Returns:
        ``(paths, next_tokens)`` as in :func:`verify_tree_greedy`.

    Raises:
        ValueError: on mismatched shapes.
    """
    toks, ok, trees = _check_tree(p, tree, draft_tokens, valid, "p")
    paths, nxt = [], []
    for b in range(len(toks)):
        node, path = -1, []
        while True:
            r = p[b, node + 1].float()
            moved = False
            for c in _kids(trees[b], node):
                if not ok[b][c]:
                    continue
                t = toks[b][c]
                u = float(torch.rand((), generator=generator, device=p.device))
                mass = float(r.sum())
                if u * mass < float(r[t]):
                    path.append(c)
                    node, moved = c, True
                    break
                r = r.clone()
                r[t] = 0.0
            if not moved:
                break
        paths.append(path)
        nxt.append(int(sample((r / r.sum())[None], generator)[0]))
    return paths, nxt
