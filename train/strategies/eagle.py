"""Training strategy for the EAGLE-1 head (Li et al. 2024).

Features ``f = hidden_states[L]`` (final-norm, see ``train/features.py``). The head at position ``t``
reads ``(token t+1, f_t + noise)`` and predicts ``f_{t+1}``; its token logits
``lm_head(f'_{t+1})`` predict token ``t + 2`` (label ``labels[t+1]``).

Unroll (``ttt_steps`` K, default 1): steps ``j >= 1`` run the head on its OWN predicted feature and
greedy draft token of step ``j-1`` at RoPE position ``t+j`` (``EagleDrafter.forward``, a
training-time-test unroll: exactly the chain ``propose`` drafts after a real prefix ending at ``t``).
Step ``j`` at ``t`` predicts ``f_{t+1+j}`` and token ``t+2+j`` and is compared with the target there,
which assumes the accepted tokens equal the data tokens (as the draft LM's unroll does; exact on data
the target generated greedily, ``data.regenerate: true``). Loss (EAGLE-1, per step ``j`` with weight
``step_weight_decay ** j``):

    feature_weight * SmoothL1(f'_{t+1+j}, f_{t+1+j}) + token_weight * recipe.loss(lm_head(f'), lm_head(f))

over the chains starting at positions whose token ``t + 2`` is supervised (assistant tokens), step
``j`` over those whose token ``t+2+j`` is too; every term is a sum over its rows divided by the number
of chain starts (``metrics["tokens"]``, see ``train.strategies.heads.chain_loss``). ``recipe.loss`` is
computed against the target's own distribution at ``t + 1 + j`` (soft) or its argmax (``ce``);
``accept_len`` chains the first ``min(ttt_steps, loss.draft_steps)`` steps (a recipe asking for it with
``ttt_steps: 1`` and ``draft_steps > 1`` is refused when validated). ``input_noise``: uniform noise
``U(-a, a)`` on the input features (EAGLE-1 uses it for robustness to its own errors).
``train_vocab_size``: compute the token term over the N most frequent supervised data tokens only
(target and draft logits both restricted to those LM-head rows and renormalised); decoding, and the
unroll's draft tokens, still use the full head. A CPU economy (BENCHMARKS.md, "Medusa, EAGLE and EAGLE-3 at
equal steps"); ``None`` uses the full vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.features import batch_features
from drafterkit.train.options import EagleOptions
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


class EagleStrategy(FeatureHeadStrategy):
    """Strategy (see ``train.strategies``) for ``kind: eagle``."""

    kind = "eagle"
    options_model = EagleOptions

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
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
        f = batch_features(target, batch, d.feature_layers, feature_store(recipe))  # [B, T, H]
        f_in = f + (torch.rand_like(f) * 2 - 1) * o.input_noise if o.input_noise > 0 else f
        labels = shift_for_next_token(batch)  # [B, T]: token t+1
        chain = torch.zeros_like(labels, dtype=torch.bool)
        chain[:, :-1] = labels[:, 1:] != -100  # step 0 at t supervised: token t+2
        starts = torch.nonzero(chain, as_tuple=True)  # N chain starts (b, t)
        outs = drafter(batch["input_ids"], f_in, o.ttt_steps, chain)  # K x [B, T, H]; outs[j][:, t] ~ f[:, t+1+j]
        w = d.lm_head.weight
        vocab = getattr(d, "train_vocab", None)
        remap = vocab_remap(vocab, d.config.vocab_size, labels.device)
        w = w if vocab is None else w[vocab]
        n = starts[0].numel()
        weights = [o.step_weight_decay ** j for j in range(o.ttt_steps)]
        reg = f.new_zeros(())
        draft_rows, target_rows, label_rows, metrics = [], [], [], {}
        for j in range(o.ttt_steps):
            y = shifted_rows(labels, starts, j + 1, fill=-100)  # token t+2+j
            p_rows, f_rows = outs[j][starts], shifted_rows(f, starts, j + 1)  # [N, H]: f'_{t+1+j}, f_{t+1+j}
            ok = y != -100
            per_row = F.smooth_l1_loss(p_rows, f_rows, reduction="none").mean(-1)  # [N]
            reg_j = (per_row * ok).sum() / max(n, 1)  # sum over this step's rows / N starts
            reg = reg + weights[j] * reg_j
            metrics[f"feature_smooth_l1_step{j}"] = float(reg_j.detach())
            draft_rows.append(p_rows @ w.t().to(p_rows.dtype))  # [N, V']
            with torch.no_grad():
                target_rows.append(f_rows @ w.t().to(f_rows.dtype))
            label_rows.append(y if remap is None else torch.where(ok, remap[y.clamp(min=0)], -100))
        tok, m = chain_loss(draft_rows, target_rows, label_rows, weights, recipe.loss)
        metrics.update(m)
        total = o.feature_weight * reg + o.token_weight * tok
        metrics.update({"feature_smooth_l1": float(reg.detach()), "token_loss": float(tok.detach()),
                        "loss": float(total.detach())})
        return total, metrics
