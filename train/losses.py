"""Drafter training losses: plain functions returning ``(loss, metrics)``.

Input convention (one for every loss): ``draft_logits`` and ``target_logits`` of shape ``[..., V]``
(typically ``[B, T, V]``; row ``t`` predicts token ``t + 1``) and an optional boolean ``mask`` of shape
``[...]`` that is True at supervised positions. The masked rows are GATHERED first (``logits[mask]``
-> ``[N, V]``), so unsupervised positions cost no memory beyond the logits themselves and get an
exactly zero gradient, and padding never changes a loss. Every loss is a sum over the N supervised
positions divided by N (not by the number of positions); N = 0 gives a finite 0 with zero gradients.
``target_logits`` carry no gradient (the target is frozen); pass them detached / under no_grad.

p = softmax(target_logits / temperature), q = softmax(draft_logits / temperature), both in float32.

Losses (name: per-token value; what decoding it targets):

* ``ce``: ``-log q(y)`` for a hard label y (the target's argmax, or the data token); greedy decoding: a
  draft token is accepted iff it equals the target's argmax.
* ``fkl``: ``KL(p || q) = sum_x p (log p - log q)``; both; mode-covering, the usual distillation loss
  (Hinton et al. 2015); at low temperature it approaches ``ce`` on the argmax.
* ``rkl``: ``KL(q || p)``; sampled decoding; mode-seeking (Gu et al. 2024, MiniLLM).
* ``jsd``: generalized JSD(beta) ``= beta KL(p||m) + (1-beta) KL(q||m)``, ``m = beta p + (1-beta) q``
  (Agarwal et al. 2024, GKD); both; bounded.
* ``tvd``: ``TVD(p, q) = 1/2 sum_x |p - q|``; sampled decoding (DistillSpec, Zhou et al. 2024).
* ``alpha``: ``1 - alpha`` with ``alpha = sum_x min(p, q)``; sampled decoding.
* ``neg_log_alpha``: ``-log alpha``; sampled decoding; stronger gradient where alpha is small (LK-alpha of
  Samarin et al. 2026, "LK Losses", arXiv 2602.23881).
* ``lk_lambda``: ``lam KL(p || q) + (1 - lam)(1 - alpha)``, ``lam = lk_scale * exp(-lk_decay * mean alpha)``
  (LK-lambda, the same paper): KL while acceptance is low, acceptance as it rises.
* ``accept_len``: ``1 - E[L]/K`` over K drafted positions; chain speculation, sampled (and greedy, see
  below).

Acceptance: with speculative sampling (Leviathan et al. 2023; Chen et al. 2023), a draft token drawn
from q is accepted with probability exactly ``alpha = sum_x min(p_x, q_x) = 1 - TVD(p, q)`` (so ``alpha``
and ``tvd`` have the same value and gradient; both exist for naming clarity). Under greedy decoding a
draft token is accepted iff it equals ``argmax p``: there use ``ce`` on the target argmax or ``fkl`` at
the decoding temperature (p sharpens toward the argmax), and train ``alpha`` losses with
``temperature`` equal to the sampling temperature that will be used at decode time.

Expected acceptance LENGTH (:func:`accept_length_loss`): a chain of K draft tokens is accepted up to
its first rejection, so with per-position acceptance probabilities ``alpha_1 .. alpha_K`` of one chain
(each conditional on the previous ones being accepted) the expected number of accepted draft tokens is

    E[L] = sum_{k=1..K} prod_{i<=k} alpha_i        (0 <= E[L] <= K; the bonus token is not counted)

and the loss is ``1 - E[L] / K`` averaged over chains (one chain starts at every supervised position;
``metrics["tokens"]`` counts the chains). The alphas come from each kind's OWN drafting, the chain the
decoder will run: step k feeds the drafter its own greedy draft tokens 1..k-1 and compares its
distribution with the target's at the real position t + k - 1, i.e. it assumes the accepted tokens
equal the data tokens (exact when the data was generated greedily by the target, ``data.regenerate:
true``). Per kind, K = ``loss.draft_steps``, at most the kind's chain (a larger value the recipe gives is refused
when it is validated; left at its default it follows the chain, ``train.draft_lengths``):

* ``draft_lm``: K passes sharing one KV cache (``train.strategies.draft_lm.unroll_alphas``); K = ``draft_steps``.
* ``medusa``: its heads at one position (Medusa's own drafting); K <= ``num_heads``.
* ``eagle``: the training-time-test unroll on its own predicted features and draft tokens
  (``EagleDrafter.forward``); K <= ``ttt_steps``.
* ``eagle3``: the TTT unroll with ``ttt_tokens: draft`` (its own draft tokens; ``Eagle3Drafter.forward``);
  K <= ``ttt_steps``.

A recipe the kind cannot serve is refused when validated (``Strategy.validate_recipe``): ``accept_len``
over ``draft_steps > 1`` on a one-step chain (``num_heads`` / ``ttt_steps`` 1: it would be plain alpha),
and EAGLE-3 with ``ttt_tokens: data`` (its unroll would chain on the data's tokens, not its drafts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-8


def gather_supervised(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[..., V]`` logits -> ``[N, V]`` rows where ``mask [...]`` is True (all rows if ``mask`` is None).

    Raises:
        ValueError: when ``mask``'s shape is not ``logits.shape[:-1]``.
    """
    if mask is None:
        return logits.reshape(-1, logits.shape[-1])
    if tuple(mask.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal logits shape without the vocabulary "
                         f"dim {tuple(logits.shape[:-1])}")
    return logits[mask.bool()]


def _pair(draft_logits, target_logits, mask, temperature):
    if draft_logits.shape != target_logits.shape:
        raise ValueError(f"draft logits {tuple(draft_logits.shape)} and target logits "
                         f"{tuple(target_logits.shape)} differ; the drafter must score the target's vocabulary")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for distribution losses, got {temperature}; for greedy "
                         "decoding use loss 'ce' (target argmax) or a small temperature")
    d = gather_supervised(draft_logits, mask).float() / temperature  # [N, V]
    t = gather_supervised(target_logits, mask).detach().float() / temperature  # [N, V]
    return F.log_softmax(d, -1), F.log_softmax(t, -1)  # log q, log p


def _finish(name: str, per_token: torch.Tensor, logq: torch.Tensor, logp: torch.Tensor):
    """Mean over the N supervised rows (0 when N == 0) plus detached metrics."""
    n = per_token.shape[0]
    loss = per_token.sum() / max(n, 1)
    with torch.no_grad():
        alpha = torch.minimum(logq.exp(), logp.exp()).sum(-1) if n else logq.new_zeros(0)
        agree = (logq.argmax(-1) == logp.argmax(-1)).float() if n else logq.new_zeros(0)
        metrics = {name: float(loss.detach()), "alpha": float(alpha.mean()) if n else 0.0,
                   "top1_agree": float(agree.mean()) if n else 0.0, "tokens": float(n)}
    return loss, metrics


def ce_loss(draft_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None,
            temperature: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Hard-label cross-entropy ``-log q(y)``.

    Args:
        draft_logits: ``[..., V]``.
        labels: LongTensor ``[...]``; ``-100`` entries are ignored (as in transformers).
        mask: optional bool ``[...]``; supervised positions are ``mask & (labels != -100)``.
        temperature: divides the logits (1.0: plain CE).
    """
    keep = labels != -100
    keep = keep & mask.bool() if mask is not None else keep
    d = gather_supervised(draft_logits, keep).float() / temperature  # [N, V]
    y = labels[keep]  # [N]
    logq = F.log_softmax(d, -1)
    per_token = -logq.gather(-1, y[:, None]).squeeze(-1)  # [N]
    n = per_token.shape[0]
    loss = per_token.sum() / max(n, 1)
    with torch.no_grad():
        agree = (logq.argmax(-1) == y).float().mean() if n else torch.zeros(())
    return loss, {"ce": float(loss.detach()), "top1_agree": float(agree), "tokens": float(n)}


def fkl_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0):
    """Forward KL(p || q) per supervised token (see module docstring). Returns ``(loss, metrics)``."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    per_token = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # [N]
    return _finish("fkl", per_token, logq, logp)


def rkl_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0):
    """Reverse KL(q || p) per supervised token. Returns ``(loss, metrics)``."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    per_token = F.kl_div(logp, logq, log_target=True, reduction="none").sum(-1)  # [N]
    return _finish("rkl", per_token, logq, logp)


def jsd_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0, beta: float = 0.5):
    """Generalized Jensen-Shannon divergence JSD(beta) (GKD, Agarwal et al. 2024), 0 < beta < 1.

    ``m = beta p + (1 - beta) q``; ``JSD = beta KL(p || m) + (1 - beta) KL(q || m)``.

    Raises:
        ValueError: ``beta`` outside (0, 1).
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd beta must be in (0, 1), got {beta}")
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    logm = torch.logsumexp(torch.stack([logp + torch.log(torch.tensor(beta)),
                                        logq + torch.log(torch.tensor(1.0 - beta))]), 0)  # [N, V]
    kl_pm = F.kl_div(logm, logp, log_target=True, reduction="none").sum(-1)
    kl_qm = F.kl_div(logm, logq, log_target=True, reduction="none").sum(-1)
    return _finish("jsd", beta * kl_pm + (1.0 - beta) * kl_qm, logq, logp)


def tvd_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0):
    """Total variation distance ``1/2 sum_x |p - q|`` (= 1 - alpha). Returns ``(loss, metrics)``."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    per_token = 0.5 * (logp.exp() - logq.exp()).abs().sum(-1)
    return _finish("tvd", per_token, logq, logp)


def acceptance_probability(draft_logits, target_logits, mask=None, temperature: float = 1.0) -> torch.Tensor:
    """Per-token speculative-sampling acceptance ``alpha = sum_x min(p, q)``: ``[N]`` in [0, 1], with grad."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    return torch.minimum(logq.exp(), logp.exp()).sum(-1)


def alpha_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0):
    """``1 - alpha`` per supervised token (expected rejection rate). Returns ``(loss, metrics)``."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    per_token = 1.0 - torch.minimum(logq.exp(), logp.exp()).sum(-1)
    return _finish("alpha", per_token, logq, logp)


def neg_log_alpha_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0):
    """``-log(alpha)`` per supervised token (alpha clamped at 1e-8). Returns ``(loss, metrics)``."""
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    per_token = -torch.log(torch.minimum(logq.exp(), logp.exp()).sum(-1).clamp_min(EPS))
    return _finish("neg_log_alpha", per_token, logq, logp)


def expected_accept_length(alphas: torch.Tensor, step_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``E[L] = sum_k prod_{i<=k} alpha_i`` per chain.

    Args:
        alphas: ``[N, K]`` per-position acceptance probabilities of N chains of K draft tokens.
        step_mask: optional bool ``[N, K]``; a False step ends its chain (alpha taken as 0 there and
            after, with zero gradient to those entries).

    Returns:
        ``[N]`` expected accepted draft tokens, in [0, K].
    """
    if alphas.dim() != 2:
        raise ValueError(f"alphas must be [N, K], got shape {tuple(alphas.shape)}")
    if step_mask is not None:
        alphas = torch.where(alive_steps(step_mask), alphas, torch.zeros_like(alphas))
    return torch.cumprod(alphas, dim=-1).sum(-1)


def alive_steps(step_mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[N, K]``: step k of a chain is alive iff ``step_mask`` holds at every step ``<= k`` (a False step
    ends its chain: the steps after it are never reached, whatever the mask says there)."""
    return step_mask.bool().long().cumprod(-1).bool()


def accept_length_loss(alphas: torch.Tensor, step_mask: torch.Tensor | None = None):
    """``1 - E[L] / K`` averaged over the N chains (see module docstring). Returns ``(loss, metrics)``.

    Metrics: ``accept_len`` (the loss), ``expected_accept_len`` (mean E[L], draft tokens per chain),
    ``alpha_step{k}`` (mean alpha at draft position k over chains alive there), ``tokens`` (N).
    """
    n, k = alphas.shape
    exp_len = expected_accept_length(alphas, step_mask)  # [N]
    loss = (1.0 - exp_len / k).sum() / max(n, 1)
    metrics = {"accept_len": float(loss.detach()),
               "expected_accept_len": float(exp_len.detach().mean()) if n else 0.0,
               "tokens": float(n)}
    with torch.no_grad():
        alive = alive_steps(step_mask) if step_mask is not None else torch.ones_like(alphas, dtype=torch.bool)
        for i in range(k):
            cnt = alive[:, i].sum()
            metrics[f"alpha_step{i + 1}"] = float(alphas[:, i][alive[:, i]].sum() / cnt) if cnt else 0.0
    return loss, metrics


def lk_lambda_loss(draft_logits, target_logits, mask=None, temperature: float = 1.0, scale: float = 1.0,
                   decay: float = 1.0):
    """LK-lambda (Samarin et al. 2026, "LK Losses", arXiv 2602.23881): forward KL blended with ``1 - alpha``
    by a weight that follows the drafter's acceptance, ``lam * KL(p || q) + (1 - lam) * (1 - alpha)`` per
    supervised token with ``lam = scale * exp(-decay * mean alpha)``, the mean over this call's N rows and
    without gradient: KL's strong gradients while acceptance is low, acceptance itself as it rises. The
    defaults (1, 1) are SpecForge's (``kl_scale``, ``kl_decay``). The mean is over the rows of one call (one
    micro-batch, one drafting position), so unlike the other losses the update depends slightly on how a step
    is split into micro-batches. Returns ``(loss, metrics)``; metrics add ``lk_weight`` (``lam``).

    Raises:
        ValueError: ``scale`` outside (0, 1] or ``decay`` < 0.
    """
    if not 0.0 < scale <= 1.0 or decay < 0.0:
        raise ValueError(f"lk_lambda needs 0 < scale <= 1 and decay >= 0, got scale {scale}, decay {decay}")
    logq, logp = _pair(draft_logits, target_logits, mask, temperature)
    kl = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # [N]
    alpha = torch.minimum(logq.exp(), logp.exp()).sum(-1)  # [N]
    lam = scale * torch.exp(-decay * alpha.detach().mean()) if alpha.numel() else alpha.new_ones(())
    loss, metrics = _finish("lk_lambda", lam * kl + (1.0 - lam) * (1.0 - alpha), logq, logp)
    metrics["lk_weight"] = float(lam)
    return loss, metrics


DISTRIBUTION_LOSSES = {
    "fkl": fkl_loss, "rkl": rkl_loss, "jsd": jsd_loss, "tvd": tvd_loss,
    "alpha": alpha_loss, "neg_log_alpha": neg_log_alpha_loss, "lk_lambda": lk_lambda_loss,
}


def distribution_loss(name: str, draft_logits, target_logits, mask, cfg):
    """The distribution loss ``name`` (a key of :data:`DISTRIBUTION_LOSSES`) with its settings from ``cfg``
    (``recipe.loss``: ``temperature``, ``jsd_beta``, ``lk_scale``, ``lk_decay``). Returns ``(loss, metrics)``."""
    if name == "jsd":
        return jsd_loss(draft_logits, target_logits, mask, cfg.temperature, beta=cfg.jsd_beta)
    if name == "lk_lambda":
        return lk_lambda_loss(draft_logits, target_logits, mask, cfg.temperature, scale=cfg.lk_scale,
                              decay=cfg.lk_decay)
    return DISTRIBUTION_LOSSES[name](draft_logits, target_logits, mask, cfg.temperature)
