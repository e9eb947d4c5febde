"""Training strategy for Medusa-1 heads (Cai et al. 2024): frozen target, heads only.

Supervision offset (tested in ``tests/test_drafters_medusa.py``): head ``k`` at position ``t`` reads the
target's final-norm state ``h_t`` and is supervised with token ``t + k + 2``, i.e. with
``labels[t + k + 1]`` where ``labels = train.data.shift_for_next_token(batch)`` (so a -100 there, a
non-assistant or padded token, drops that term). Soft labels: the target's own distribution over
that token is its logits at position ``t + k + 1``. The per-head loss is ``recipe.loss`` (one term or
a weighted mix, see ``train/losses.py``; ``ce`` uses the target's argmax or the data token per
``loss.ce_labels``), weighted by ``head_weight_decay ** k`` (Medusa uses 0.8^k) and summed over heads.
``accept_len`` treats the K heads at one position as a chain of K draft tokens.

To save memory the LM head is applied only at supervised rows (``[N, H] -> [N, V]``), never to the
whole ``[K, B, T, V]`` block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from train import losses
from train.data import shift_for_next_token
from train.features import batch_features
from train.strategies import check_common_batch, unwrap


class MedusaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_heads: int = Field(5, ge=1, le=16)
    num_layers: int = Field(1, ge=1, le=4)  # residual blocks per head
    share_lm_head: bool = True  # False: own LM head per head (K x V x H parameters)
    head_weight_decay: float = Field(0.8, gt=0.0, le=1.0)  # loss weight of head k = decay ** k
    train_vocab_size: int | None = Field(None, ge=2)  # token losses over the N most frequent data tokens
    feature_cache: bool = False  # keep target features on disk under output_dir/feature_cache (epochs 2+ skip the target)


def chain_loss(draft_rows: list[torch.Tensor], target_rows: list[torch.Tensor], label_rows: list[torch.Tensor],
               step_weights: list[float], loss_cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss over K draft steps evaluated at the same N start positions (Medusa heads, EAGLE-3 TTT).

    Args:
        draft_rows / target_rows: K tensors ``[N, V]`` of draft / target logits for step k.
        label_rows: K LongTensors ``[N]``: the data token of step k, ``-100`` where unsupervised.
        step_weights: K floats (e.g. ``0.8 ** k``), multiplying each step's per-term loss.
        loss_cfg: ``recipe.loss`` (``terms()``, ``temperature``, ``ce_labels``, ``jsd_beta``, ``draft_steps``).

    Returns:
        ``(loss, metrics)``; metrics hold ``{term}_step{k}``, ``top1_step{k}`` (draft argmax == target
        argmax at supervised rows) and ``loss``. ``accept_len`` uses the first ``draft_steps`` steps.
    """
    k_steps = len(draft_rows)
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
        for j in range(k_steps):
            d, t, v = draft_rows[j], target_rows[j], valid[j]
            if name == "ce":
                y = t.argmax(-1) if loss_cfg.ce_labels == "target" else label_rows[j]
                value, _ = losses.ce_loss(d, y.masked_fill(~v, -100))
            elif name == "jsd":
                value, _ = losses.jsd_loss(d, t, v, temp, beta=loss_cfg.jsd_beta)
            else:
                value, _ = losses.DISTRIBUTION_LOSSES[name](d, t, v, temp)
            total = total + w * step_weights[j] * value
            metrics[f"{name}_step{j}"] = float(value.detach())
    with torch.no_grad():
        for j in range(k_steps):
            v = valid[j]
            agree = (draft_rows[j].argmax(-1) == target_rows[j].argmax(-1))[v].float()
            metrics[f"top1_step{j}"] = float(agree.mean()) if v.any() else 0.0
    metrics["loss"] = float(total.detach())
    return total, metrics


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


def feature_store(recipe: Any, layers):
    """The recipe's :class:`train.features.FeatureStore` (``output_dir/feature_cache``) when
    ``drafter.options.feature_cache`` is true, else None."""
    if not recipe.drafter.options.get("feature_cache"):
        return None
    from train.features import FeatureStore

    return FeatureStore(Path(recipe.output_dir) / "feature_cache", layers)


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


def head_labels(batch: dict[str, torch.Tensor], num_heads: int):
    """Start positions and per-head labels.

    Returns ``(starts, labels)``: ``starts`` = ``(b [N], t [N])``, every position whose head-0 label
    (token ``t + 2``) is supervised; ``labels[k] [N]`` = token ``t + k + 2`` (``labels_next[t + k + 1]``
    from ``shift_for_next_token``), -100 where unsupervised or past the end.
    """
    labels = shift_for_next_token(batch)  # [B, T]
    starts = torch.nonzero(labels[:, 1:] != -100, as_tuple=True)  # head 0 supervised at t: labels[t+1]
    return starts, [shifted_rows(labels, starts, k + 1, fill=-100) for k in range(num_heads)]


class MedusaStrategy:
    """Strategy (see ``train.strategies``) for ``kind: medusa``."""

    kind = "medusa"
    options_model = MedusaOptions

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        from drafters.medusa import MedusaConfig, MedusaDrafter

        o: MedusaOptions = recipe.drafter.parsed_options()
        if recipe.eval.k > o.num_heads:
            raise ValueError(f"eval.k={recipe.eval.k} but Medusa with num_heads={o.num_heads} proposes at most "
                             f"{o.num_heads} tokens per round; set eval.k <= {o.num_heads} or more heads")
        cfg = MedusaConfig.from_target(target, num_heads=o.num_heads, num_layers=o.num_layers,
                                       share_lm_head=o.share_lm_head)
        from train.strategies.eagle3 import register_train_vocab

        drafter = trainable_own(MedusaDrafter(cfg, target=target), target)
        register_train_vocab(drafter, recipe, tokenizer, o.train_vocab_size)
        return drafter

    def check_batch(self, batch: dict[str, Any]) -> None:
        check_common_batch(batch)
        if batch["input_ids"].shape[1] < 3:
            raise ValueError("Medusa batches need sequences of >= 3 tokens (head 0 predicts 2 positions ahead)")

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)``: per-head ``recipe.loss`` against token ``t + k + 2`` (see module docstring)."""
        if batch.get("on_policy"):
            raise ValueError("medusa training does not support on-policy batches; set data.on_policy_fraction: 0")
        from train.strategies.eagle3 import vocab_remap

        d = unwrap(drafter)
        store = feature_store(recipe, d.feature_layers)
        hidden = batch_features(target, batch, d.feature_layers, store)  # [B, T, H] final-norm states
        starts, label_rows = head_labels(batch, d.config.num_heads)
        vocab = getattr(d, "train_vocab", None)  # None: full vocabulary
        remap = vocab_remap(vocab, d.config.vocab_size, hidden.device)
        # the target's logits once per supervised position (heads share positions t+k+1)
        sup = shift_for_next_token(batch) != -100
        index = torch.full(sup.shape, -1, dtype=torch.long, device=hidden.device)
        index[sup] = torch.arange(int(sup.sum()), device=hidden.device)
        w_t = target.get_output_embeddings().weight
        w_t = w_t if vocab is None else w_t[vocab]
        with torch.no_grad():
            t_all = (hidden[sup].to(w_t.dtype) @ w_t.t()).float()  # [P, V']
        blocks = drafter(hidden[starts], return_hidden=True)  # [K, N, H] (through any DDP wrapper)
        draft_rows, target_rows = [], []
        for k in range(d.config.num_heads):
            w = d.lm_head.weight if d.config.share_lm_head else d.lm_heads[k].weight
            w = w if vocab is None else w[vocab]
            draft_rows.append((blocks[k].to(w.dtype) @ w.t()).float())  # [N, V']
            target_rows.append(t_all[shifted_rows(index, starts, k + 1, fill=-1).clamp(min=0)])
            if remap is not None:
                y = label_rows[k]
                label_rows[k] = torch.where(y >= 0, remap[y.clamp(min=0)], -100)
        o: MedusaOptions = recipe.drafter.parsed_options()
        weights = [o.head_weight_decay ** k for k in range(d.config.num_heads)]
        return chain_loss(draft_rows, target_rows, label_rows, weights, recipe.loss)

    def save(self, drafter, path: str | Path) -> None:
        unwrap(drafter).save_pretrained(path)
