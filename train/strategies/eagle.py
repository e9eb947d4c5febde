"""Training strategy for the EAGLE-1 head (Li et al. 2024).

Features ``f = hidden_states[L]`` (final-norm, see ``train/features.py``). The head at position ``t``
reads ``(token t+1, f_t + noise)`` and predicts ``f_{t+1}``; its token logits
``lm_head(f'_{t+1})`` predict token ``t + 2`` (label ``labels[t+1]``). Loss (EAGLE-1):

    feature_weight * SmoothL1(f'_{t+1}, f_{t+1}) + token_weight * recipe.loss(lm_head(f'), lm_head(f))

over positions whose token ``t + 2`` is supervised (assistant tokens). ``recipe.loss`` is computed
against the target's own distribution at ``t + 1`` (soft) or its argmax (``ce``). ``input_noise``:
uniform noise ``U(-a, a)`` on the input features (EAGLE-1 uses it for robustness to its own errors).
``train_vocab_size``: compute the token term over the N most frequent supervised data tokens only
(target and draft logits both restricted to those LM-head rows and renormalised); decoding still uses
the full head. A CPU economy (see MEASURED.md); ``None`` uses the full vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from train.data import shift_for_next_token
from train.features import batch_features
from train.strategies import unwrap
from train.strategies.heads import (
    FeatureHeadStrategy,
    chain_loss,
    feature_store,
    register_train_vocab,
    trainable_own,
    vocab_remap,
)


class EagleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    feature_weight: float = Field(1.0, ge=0.0)
    token_weight: float = Field(0.1, ge=0.0)
    input_noise: float = Field(0.0, ge=0.0)  # uniform noise amplitude on input features
    init_from_target_layer: bool = True  # copy the target's last decoder layer into the head
    train_vocab_size: int | None = Field(None, ge=2)
    feature_cache: bool = False  # keep target features on disk under output_dir/feature_cache (epochs 2+ skip the target)


class EagleStrategy(FeatureHeadStrategy):
    """Strategy (see ``train.strategies``) for ``kind: eagle``."""

    kind = "eagle"
    options_model = EagleOptions

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        from drafters.eagle import EagleConfig, EagleDrafter

        o: EagleOptions = recipe.drafter.parsed_options()
        drafter = EagleDrafter(EagleConfig.from_target(target), target=target,
                               init_from_target=o.init_from_target_layer)
        drafter = trainable_own(drafter, target)
        register_train_vocab(drafter, recipe, target, tokenizer, o.train_vocab_size)
        return drafter

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)``, see the module docstring."""
        self.refuse_on_policy(batch)
        d = unwrap(drafter)
        o: EagleOptions = recipe.drafter.parsed_options()
        f = batch_features(target, batch, d.feature_layers, feature_store(recipe, d.feature_layers))
        f_in = f + (torch.rand_like(f) * 2 - 1) * o.input_noise if o.input_noise > 0 else f
        pred = drafter(batch["input_ids"], f_in)  # [B, T-1, H]; pred[:, t] ~ f[:, t+1]
        labels = shift_for_next_token(batch)[:, 1:]  # [B, T-1]: token t+2
        sup = labels != -100
        p_rows, f_rows = pred[sup], f[:, 1:][sup]  # [N, H]
        reg = F.smooth_l1_loss(p_rows, f_rows) if p_rows.numel() else pred.sum() * 0.0
        w = d.lm_head.weight
        vocab = getattr(d, "train_vocab", None)
        y = labels[sup]
        if vocab is not None:
            w, y = w[vocab], vocab_remap(vocab, d.config.vocab_size, y.device)[y]
        d_logits = p_rows @ w.t().to(p_rows.dtype)  # [N, V']
        with torch.no_grad():
            t_logits = f_rows @ w.t().to(f_rows.dtype)
        tok, metrics = chain_loss([d_logits], [t_logits], [y], [1.0], recipe.loss)
        total = o.feature_weight * reg + o.token_weight * tok
        metrics.update({"feature_smooth_l1": float(reg.detach()), "token_loss": float(tok.detach()), "loss": float(total.detach())})
        return total, metrics
