"""Training strategy for Medusa-1 heads (Cai et al. 2024): frozen target, heads only.

Supervision offset (tested in ``tests/test_drafters_medusa.py``): head ``k`` at position ``t`` reads the
target's final-norm state ``h_t`` and is supervised with token ``t + k + 2``, i.e. with
``labels[t + k + 1]`` where ``labels = train.data.shift_for_next_token(batch)`` (so a -100 there, a
non-assistant or padded token, drops that term). Soft labels: the target's own distribution over
that token is its logits at position ``t + k + 1``. The per-head loss is ``recipe.loss`` (one term or
a weighted mix, see ``train/losses.py``; ``ce`` uses the target's argmax or the data token per
``loss.ce_labels``), weighted by ``head_weight_decay ** k`` (Medusa uses 0.8^k) and summed over heads.
``accept_len`` treats the heads at one position as a chain (Medusa's own drafting) of
``min(num_heads, loss.draft_steps)`` draft tokens; with one head and ``draft_steps > 1`` the recipe is
refused when validated.

To save memory the LM head is applied only at supervised rows (``[N, H] -> [N, V]``), never to the
whole ``[K, B, T, V]`` block.
"""

from __future__ import annotations

from typing import Any

import torch

from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.features import batch_features
from drafterkit.train.options import MedusaOptions
from drafterkit.train.strategies.base import unwrap
from drafterkit.train.strategies.heads import (
    FeatureHeadStrategy,
    chain_loss,
    feature_store,
    register_train_vocab,
    shifted_rows,
    trainable_own,
    vocab_remap,
)


def head_labels(batch: dict[str, torch.Tensor], num_heads: int):
    """Start positions and per-head labels.

    Returns ``(starts, labels)``: ``starts`` = ``(b [N], t [N])``, every position whose head-0 label
    (token ``t + 2``) is supervised; ``labels[k] [N]`` = token ``t + k + 2`` (``labels_next[t + k + 1]``
    from ``shift_for_next_token``), -100 where unsupervised or past the end.
    """
    labels = shift_for_next_token(batch)  # [B, T]
    starts = torch.nonzero(labels[:, 1:] != -100, as_tuple=True)  # head 0 supervised at t: labels[t+1]
    return starts, [shifted_rows(labels, starts, k + 1, fill=-100) for k in range(num_heads)]


class MedusaStrategy(FeatureHeadStrategy):
    """Strategy (see ``train.strategies``) for ``kind: medusa``."""

    kind = "medusa"
    options_model = MedusaOptions

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        o: MedusaOptions = recipe.drafter.parsed_options()
        cfg = MedusaConfig.from_target(target, num_heads=o.num_heads, num_layers=o.num_layers,
                                       share_lm_head=o.share_lm_head)
        drafter = trainable_own(MedusaDrafter(cfg, target=target), target)
        register_train_vocab(drafter, recipe, target, tokenizer, o.train_vocab_size)
        return drafter

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)``: per-head ``recipe.loss`` against token ``t + k + 2`` (see module docstring)."""
        self.refuse_on_policy(batch)
        d = unwrap(drafter)
        hidden = batch_features(target, batch, d.feature_layers, feature_store(recipe))  # [B, T, H] final-norm states
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
