"""What the feature-head strategies (Medusa, EAGLE, EAGLE-3) share: one base class and the loss plumbing.

* :class:`FeatureHeadStrategy`: the batch check, the refusal of on-policy batches, ``save`` and
  ``feature_layers`` (what the recipe refuses for these kinds is checked by ``train.options``).
* :func:`chain_loss`: ``recipe.loss`` over K draft steps at the same N start positions (Medusa heads,
  the EAGLE-3 TTT unroll, EAGLE's single step, P-EAGLE's depths, DFlash's block positions), with per-step
  weights, or D-PACE's (:func:`dpace_weights`) on the ce term.
* :func:`shifted_rows`: gather ``x[b, t + shift]`` at start positions (the label/target offset of step k).
* :func:`feature_store`, :func:`trainable_own`, :func:`count_data_tokens`, :func:`register_train_vocab`,
  :func:`vocab_remap`: whether the run reads the offline feature cache, device/dtype of the trainable
  tensors, and the reduced (most-frequent-token) vocabularies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from drafterkit.drafters.eagle3 import select_draft_vocab
from drafterkit.train import losses
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.features import batch_features
from drafterkit.train.recipe_data import load_data
from drafterkit.train.strategies.base import check_common_batch, unwrap


class FeatureHeadStrategy:
    """Base of the head strategies; subclasses set ``kind``, ``options_model`` and implement ``build``
    and ``loss`` (calling :meth:`refuse_on_policy` first)."""

    kind = ""
    min_tokens = 3  # a head at t predicts token t + 2: shorter sequences hold no supervised pair

    def check_batch(self, batch: dict[str, Any]) -> None:
        check_common_batch(batch)
        if batch["input_ids"].shape[1] < self.min_tokens:
            raise ValueError(f"{self.kind} batches need sequences of >= {self.min_tokens} tokens (the head at "
                             "position t predicts token t + 2)")

    def units(self, batch: dict[str, Any], recipe: Any) -> int:
        """The chain starts :meth:`loss` will average over (``metrics["tokens"]``), from the batch alone: the
        positions ``t`` whose token ``t + 2`` is supervised (``loss_mask``). The training step counts them
        for the whole optimizer step before its first backward (``train.step.train_step``)."""
        labels = shift_for_next_token(batch)  # [B, T]
        return int((labels[:, 1:] != -100).sum())

    def refuse_on_policy(self, batch: dict[str, Any]) -> None:
        """Raise ``ValueError`` for an on-policy (DistillSpec) batch, naming the recipe fix."""
        if batch.get("on_policy"):
            raise ValueError(f"{self.kind} training does not support on-policy batches; set "
                             "data.on_policy_fraction: 0")

    def save(self, drafter, path: str | Path) -> None:
        unwrap(drafter).save_pretrained(path)

    def fused_features(self, drafter, target, batch: dict[str, Any], recipe: Any):
        """For the kinds that fuse several target layers (EAGLE-3, DFlash): refuse an on-policy batch, then
        read the drafter's ``feature_layers`` and the last layer (online or from the offline cache).

        Returns:
            ``(drafter, fused, last)``: the unwrapped drafter, ``fused`` ``[B, T, nF * H]`` (the layers in
            the drafter's order, concatenated) and ``last`` ``[B, T, H]`` (the final-norm last layer, whose
            LM head gives the target's logits).
        """
        self.refuse_on_policy(batch)
        d = unwrap(drafter)
        layers = list(d.feature_layers) + [d.config.target_num_layers]
        feats = batch_features(target, batch, layers, feature_store(recipe))  # [B, T, (nF + 1) H]
        h = d.config.hidden_size
        return d, feats[..., :-h], feats[..., -h:]

    def feature_layers(self, recipe: Any, target: torch.nn.Module) -> list[int]:
        """The ``hidden_states`` indices the loss reads (``train.features.batch_features``), what the offline
        feature cache (``train/feature_cache.py``) holds: the final-norm last layer ``[L]`` here."""
        return [target.config.num_hidden_layers]


def chain_loss(draft_rows: list[torch.Tensor], target_rows: list[torch.Tensor], label_rows: list[torch.Tensor],
               step_weights: list[float], loss_cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss over K draft steps evaluated at the same N start positions (Medusa heads, EAGLE / EAGLE-3 unrolls).

    Normalisation: every term is a SUM over its supervised rows divided by N, the number of chain starts
    (``metrics["tokens"]``), whatever the step. A step whose rows run past a sequence's supervised span
    therefore weighs by the chains that reach it; the training loop turns the result back into a sum
    (``loss * tokens``) and divides by the starts of the whole optimizer step (``train.step.train_step``).

    Args:
        draft_rows / target_rows: K tensors ``[N, V]`` of draft / target logits for step k.
        label_rows: K LongTensors ``[N]``: the data token of step k, ``-100`` where unsupervised.
        step_weights: K floats (e.g. ``0.8 ** k``), multiplying each step's per-term loss (the ce term's weights
            are D-PACE's instead under ``loss.position_weights: dpace``, :func:`dpace_weights`).
        loss_cfg: ``recipe.loss`` (``terms()``, ``temperature``, ``ce_labels``, ``draft_steps`` and the
            settings :func:`train.losses.distribution_loss` reads).

    Returns:
        ``(loss, metrics)``; metrics hold ``{term}_step{k}`` (that step's sum / N), ``top1_step{k}`` (draft
        argmax == target argmax at supervised rows), ``tokens`` (N) and ``loss``. ``accept_len`` uses the
        first ``draft_steps`` steps as one chain per start.
    """
    k_steps = len(draft_rows)
    n = draft_rows[0].shape[0]
    valid = [y != -100 for y in label_rows]
    total = draft_rows[0].new_zeros(())
    metrics: dict[str, float] = {}
    temp = loss_cfg.temperature
    for name, w in loss_cfg.terms().items():
        if name == "accept_len":
            k = min(k_steps, loss_cfg.draft_steps)
            alphas = torch.stack([_alpha_rows(draft_rows[j], target_rows[j], temp) for j in range(k)], 1)
            value, m = losses.accept_length_loss(alphas, torch.stack(valid[:k], 1))
            total = total + w * value
            metrics.update(m)
            continue
        if name == "ce" and loss_cfg.position_weights == "dpace":
            value, m = _dpace_ce(draft_rows, target_rows, label_rows, valid, loss_cfg, n)
            total = total + w * value
            metrics.update(m)
            continue
        for j in range(k_steps):
            d, t, v = draft_rows[j], target_rows[j], valid[j]
            if name == "ce":
                y = t.argmax(-1) if loss_cfg.ce_labels == "target" else label_rows[j]
                value, _ = losses.ce_loss(d, y.masked_fill(~v, -100))
            else:
                value, m = losses.distribution_loss(name, d, t, v, loss_cfg)
                if "lk_weight" in m:  # lk_lambda's KL weight at this drafting position
                    metrics[f"lk_weight_step{j}"] = m["lk_weight"]
            value = value * (int(v.sum()) / max(n, 1))  # mean over this step's rows -> sum / N starts
            total = total + w * step_weights[j] * value
            metrics[f"{name}_step{j}"] = float(value.detach())
    with torch.no_grad():
        for j in range(k_steps):
            v = valid[j]
            agree = (draft_rows[j].argmax(-1) == target_rows[j].argmax(-1))[v].float()
            metrics[f"top1_step{j}"] = float(agree.mean()) if v.any() else 0.0
    metrics["tokens"] = float(n)
    metrics["loss"] = float(total.detach())
    return total, metrics


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE's position weights ("D-PACE: Dynamic Position-Aware Cross-Entropy for Parallel Speculative
    Drafting", arXiv 2605.18810, Eqs. 7-8), without gradient.

    Each chain's confidence at step i is ``q_i = exp(-ce_i)``, smoothed to ``r_i = (1 - alpha) q_i + alpha``;
    step j weighs ``w_j = sum_{m >= j} prod_{i <= m} r_i``: the chance the chain reaches step j times the
    accepted length still to come from there, so a step counts by its share of the expected accepted length.
    A chain ends at its first unsupervised step (zero weight there and after).

    Args:
        ce: ``[N, K]`` cross-entropy of each chain's step (any value where not ``valid``).
        valid: bool ``[N, K]``: the step is supervised.
        alpha: smoothing in (0, 1] (the paper's default 0.5; 1 gives every step of a chain ``K - j``).

    Returns:
        ``[N, K]`` float weights, detached.
    """
    with torch.no_grad():
        alive = losses.alive_steps(valid).float()
        smoothed = ((1.0 - alpha) * torch.exp(-ce.float()) + alpha) * alive
        reach = torch.cumprod(smoothed, dim=-1)  # [N, K]: prod_{i <= m} r_i, 0 past the chain's end
        return torch.flip(torch.cumsum(torch.flip(reach, [-1]), -1), [-1]) * alive


def _dpace_ce(draft_rows, target_rows, label_rows, valid, loss_cfg, n: int):
    """The ce term weighted by :func:`dpace_weights` instead of the kind's fixed step decay: ``sum_{n, j} w_nj
    ce_nj / N`` over the N chain starts (the normalisation D-PACE's author asks for, not the weights' sum)."""
    ce = []
    for j, (d, t, y) in enumerate(zip(draft_rows, target_rows, label_rows)):
        labels = t.argmax(-1) if loss_cfg.ce_labels == "target" else y
        labels = labels.masked_fill(~valid[j], 0)
        ce.append(-torch.log_softmax(d.float(), -1).gather(-1, labels[:, None]).squeeze(-1))  # [N]
    ce = torch.stack(ce, 1)  # [N, K]
    mask = torch.stack(valid, 1)
    weights = dpace_weights(ce.detach(), mask, loss_cfg.dpace_alpha)
    value = (weights * torch.where(mask, ce, torch.zeros_like(ce))).sum() / max(n, 1)
    metrics = {f"ce_step{j}": float((ce[:, j].detach() * mask[:, j]).sum() / max(n, 1)) for j in range(ce.shape[1])}
    metrics.update({f"dpace_weight_step{j}": float(weights[:, j].sum() / max(int(mask[:, j].sum()), 1))
                    for j in range(ce.shape[1])})
    return value, metrics


def _alpha_rows(d: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    q = torch.softmax(d.float() / temperature, -1)
    p = torch.softmax(t.detach().float() / temperature, -1)
    return torch.minimum(p, q).sum(-1)  # [N]


def shifted_rows(x: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor], shift: int, fill: int | None = None):
    """``x[b, t + shift]`` at the (b, t) pairs ``rows`` (``[N]`` each); positions past the end are clamped
    (and, with ``fill``, replaced by ``fill``: use -100 for labels)."""
    b, t = rows
    pos = t + shift
    out = x[b, pos.clamp(max=x.shape[1] - 1)]
    if fill is not None:
        out = out.masked_fill(pos >= x.shape[1], fill)
    return out


def feature_store(recipe: Any) -> str | None:
    """``recipe.data.feature_cache`` when the run reads the offline feature cache, else None: what a loss
    passes to ``train.features.batch_features``, so an offline run never falls back to a target forward
    (the cached batch names its layers, checked by ``batch_features``)."""
    setting = recipe.data.feature_cache
    return None if setting == "off" else setting


def trainable_own(drafter, target: torch.nn.Module):
    """Move the drafter's OWN tensors to the target's device (params fp32, trainable); borrowed target
    modules are left as they are (frozen). Returns the drafter in train mode."""
    dev = next(target.parameters()).device
    for name, p in drafter.named_parameters():
        if not name.startswith(drafter.borrowed_prefixes):
            p.data = p.data.to(dev, torch.float32)
            p.requires_grad_(True)
    for name, b in drafter.named_buffers():
        if not name.startswith(drafter.borrowed_prefixes):
            b.data = b.data.to(dev)
    return drafter.train()


def count_data_tokens(recipe: Any, target: torch.nn.Module, tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """Counts ``[V]`` of supervised (``loss_mask == 1``) token ids in the data the run trains on
    (``train.recipe_data.load_data``: the recipe's training split, or the target's regenerated responses
    with ``data.regenerate``; both cached, so the loop's own load is a cache hit)."""
    ds = load_data(recipe, target, tokenizer)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ex in ds.with_format("numpy"):
        ids, lm = np.asarray(ex["input_ids"], dtype=np.int64), np.asarray(ex["loss_mask"]).astype(bool)
        counts += np.bincount(ids[lm], minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(counts)


def register_train_vocab(drafter, recipe: Any, target: torch.nn.Module, tokenizer: Any, n: int | None) -> None:
    """With ``n``, give ``drafter`` a non-persistent buffer ``train_vocab`` (sorted ids ``[n]``) of the n
    most frequent supervised data tokens; token losses are then computed over those LM-head rows only
    (a training economy for full-vocabulary heads; not saved, decoding is unaffected)."""
    if not n:
        return
    counts = count_data_tokens(recipe, target, tokenizer, drafter.config.vocab_size)
    ids = select_draft_vocab(counts, min(n, drafter.config.vocab_size))
    drafter.register_buffer("train_vocab", ids.to(next(drafter.parameters()).device), persistent=False)


def vocab_remap(vocab: torch.Tensor | None, vocab_size: int, device) -> torch.Tensor | None:
    """``[V]`` target id -> index in ``vocab`` (-100 outside), or None when ``vocab`` is None."""
    if vocab is None:
        return None
    remap = torch.full((vocab_size,), -100, dtype=torch.long, device=device)
    remap[vocab] = torch.arange(vocab.numel(), device=device)
    return remap
