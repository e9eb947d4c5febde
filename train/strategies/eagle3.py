"""Training strategy for the EAGLE-3 head (Li et al. 2025), with training-time test (TTT).

Build: the draft vocabulary is the ``draft_vocab_size`` most frequent SUPERVISED (assistant) tokens of
the recipe's training data (as SpecForge / EAGLE-3 do), stored in ``d2t`` / ``t2d``; the head's LM
rows and final norm start from the target's; with ``init_from_target_layer`` the MLP, o_proj and
post-attention norm start from the target's last decoder layer (q/k/v are 2H wide and stay random).

Loss: the head is unrolled ``ttt_steps`` steps (``Eagle3Drafter.forward``). Step ``j`` at start position
``t`` predicts token ``t + 2 + j``; its target is the target's distribution at position ``t + 1 + j``
RESTRICTED to the draft vocabulary (target logits gathered at the ``t2d`` ids, renormalised by the
softmax); as in EAGLE-3, a position whose target argmax lies outside the draft vocabulary is
dropped (the renormalised distribution would teach a token the target would not pick). ``recipe.loss``
terms apply per step with weight ``step_weight_decay ** j`` (EAGLE-3: 0.8^j); ``accept_len`` uses the
TTT unroll as the chain (alpha of step j is conditional on steps < j being accepted, since step j was
fed the data tokens, i.e. the chain where every earlier draft was right).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from train.data import shift_for_next_token
from train.features import batch_features, target_logits
from train.strategies import unwrap
from train.strategies.heads import (
    FeatureHeadStrategy,
    chain_loss,
    count_data_tokens,
    feature_store,
    shifted_rows,
    trainable_own,
)


class Eagle3Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    draft_vocab_size: int = Field(8192, ge=2)  # clamped to the target's vocabulary
    feature_layers: list[int] | None = None  # hidden_states indices; None: (2, L//2, L-3)
    ttt_steps: int = Field(3, ge=1, le=16)
    step_weight_decay: float = Field(0.8, gt=0.0, le=1.0)
    init_from_target_layer: bool = True
    feature_cache: bool = False  # keep target features on disk under output_dir/feature_cache (epochs 2+ skip the target)


class Eagle3Strategy(FeatureHeadStrategy):
    """Strategy (see ``train.strategies``) for ``kind: eagle3``."""

    kind = "eagle3"
    options_model = Eagle3Options

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        from drafters.eagle import init_layer_from_target
        from drafters.eagle3 import Eagle3Config, Eagle3Drafter, select_draft_vocab

        o: Eagle3Options = recipe.drafter.parsed_options()
        cfg = Eagle3Config.from_target(target, draft_vocab_size=o.draft_vocab_size,
                                       feature_layers=list(o.feature_layers or []), ttt_steps=o.ttt_steps)
        drafter = Eagle3Drafter(cfg, target=target)
        counts = count_data_tokens(recipe, tokenizer, cfg.vocab_size)
        drafter.set_draft_vocab(select_draft_vocab(counts, cfg.draft_vocab_size), target=target)
        if o.init_from_target_layer:
            init_layer_from_target(drafter.layer, target)
        return trainable_own(drafter, target)

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)`` over the TTT unroll, see the module docstring."""
        self.refuse_on_policy(batch)
        d = unwrap(drafter)
        o: Eagle3Options = recipe.drafter.parsed_options()
        layers = list(d.feature_layers) + [d.config.target_num_layers]
        feats = batch_features(target, batch, layers, feature_store(recipe, layers))  # [B, T, 4H]
        h = d.config.hidden_size
        fused, last = feats[..., : 3 * h], feats[..., 3 * h:]
        ids = batch["input_ids"]
        outs = drafter(ids, fused, o.ttt_steps, return_hidden=True)  # steps x [B, T, H]
        labels = shift_for_next_token(batch)  # [B, T]
        t_rows, in_vocab, index = restricted_target(target, last, labels, d)
        label_draft = torch.cumsum(d.t2d.long(), 0) - 1  # target id -> draft id (where t2d)
        starts = torch.nonzero(labels[:, 1:] != -100, as_tuple=True)  # step 0 supervised at t
        draft_rows, target_rows, label_rows = [], [], []
        for j in range(o.ttt_steps):
            draft_rows.append(d.draft_logits(outs[j][starts]).float())  # LM head on supervised rows: [N, Nd]
            y = shifted_rows(labels, starts, j + 1, fill=-100)  # data token t+2+j (target id)
            r = shifted_rows(index, starts, j + 1, fill=-1)  # row of position t+1+j in t_rows
            ok = (y != -100) & (r >= 0)
            ok = ok & in_vocab[r.clamp(min=0)]
            t_j = t_rows[r.clamp(min=0)]  # [N, Nd]
            target_rows.append(t_j)
            # data token as a draft id; one outside the draft vocab is replaced by the target's argmax
            # (only `ce` with ce_labels: data reads it; soft terms only need the row to be valid)
            yc = y.clamp(min=0)
            y_d = torch.where(d.t2d[yc], label_draft[yc], t_j.argmax(-1))
            label_rows.append(torch.where(ok, y_d, -100))
        weights = [o.step_weight_decay ** j for j in range(o.ttt_steps)]
        loss, metrics = chain_loss(draft_rows, target_rows, label_rows, weights, recipe.loss)
        metrics["draft_vocab_coverage"] = float(in_vocab.float().mean()) if in_vocab.numel() else 0.0
        return loss, metrics


@torch.no_grad()
def restricted_target(target, last_hidden: torch.Tensor, labels: torch.Tensor, drafter):
    """Target logits at every supervised position, restricted to the draft vocabulary.

    Returns ``(rows [P, N], in_vocab [P] bool: target argmax is a draft token, index [B, T] long: row
    of each position in ``rows`` or -1)``, for the P positions with ``labels != -100``.
    """
    sup = labels != -100
    index = torch.full(labels.shape, -1, dtype=torch.long, device=labels.device)
    index[sup] = torch.arange(int(sup.sum()), device=labels.device)
    full = target_logits(target, last_hidden[sup]).float()  # [P, V]
    in_vocab = drafter.t2d[full.argmax(-1)] if full.numel() else torch.zeros(0, dtype=torch.bool)
    return full[:, drafter.draft_ids()], in_vocab, index
