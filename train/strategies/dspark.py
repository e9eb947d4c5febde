"""Training strategy for the DSpark drafter (``drafters.dspark``; DSpark, arXiv 2607.05147).

Blocks as DFlash's (``train.strategies.dflash``: anchors ``a`` drawn among supervised positions, all blocks of a
batch in one pass, the same build from the target), but DSpark's block ``[token a, noise x (S-1)]`` drafts from
its first position: position ``s`` (0-based) drafts token ``a + s + 1``, compared with the target's distribution at
``a + s``.

Loss, the backbone and the Markov head jointly: each position's draft logits are the block's plus the Markov
bias of the token before the drafted one, taken from the data (teacher forcing: the tokens the decoder has when
every earlier draft was accepted), ``lm_head(norm(h_s)) + markov_w2(markov_w1(x_{a+s}))``; every term of
``recipe.loss`` applies per position with DFlash's weights ``exp(-s / position_weight_gamma)``
(:meth:`DFlashStrategy.chain_terms`); ``train_markov_head: false`` leaves the bias out, so the head's output
matrix keeps its zero start (an ablation: a backbone trained without the head). Plus, with ``confidence_head``,
``confidence_weight`` times the binary cross-entropy of the confidence head against whether that position's top-1
(Markov bias included) is the target's top-1, i.e. whether greedy verification accepts it when every earlier
position was accepted; its inputs are detached, so it learns to read the drafter without moving it. Sum over
supervised rows divided by the number of blocks, as the chain terms. Logged: ``confidence_bce``, ``confidence_acc``
(confidence > 0.5 agrees with the outcome) and ``accepted_rate`` (the outcome's mean).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
from drafterkit.train.options import DSparkOptions, draft_vocab_refusal
from drafterkit.train.strategies.dflash import DFlashStrategy


class DSparkStrategy(DFlashStrategy):
    """Strategy (see ``train.strategies``) for ``kind: dspark``."""

    kind = "dspark"
    options_model = DSparkOptions
    drafter_class = DSparkDrafter

    def config(self, recipe: Any, target: torch.nn.Module) -> DSparkConfig:
        o: DSparkOptions = recipe.drafter.parsed_options()
        if why := draft_vocab_refusal(o, target.config.vocab_size):  # a target whose config was not local
            raise ValueError(why)
        return DSparkConfig.from_target(target, num_layers=o.num_layers, block_size=o.block_size,
                                        draft_vocab_size=o.draft_vocab_size or 0, mask_token_id=o.mask_token_id,
                                        feature_layers=list(o.feature_layers or []), markov_rank=o.markov_rank,
                                        confidence_head=o.confidence_head,
                                        confidence_with_markov=o.confidence_with_markov)

    def slot_logits(self, drafter: DSparkDrafter, hidden: torch.Tensor, prev: torch.Tensor,
                    recipe: Any) -> torch.Tensor:
        """The block's logits plus the Markov bias of ``prev [N]`` (the data token before the drafted one); the
        block's logits alone with ``train_markov_head: false``."""
        if not recipe.drafter.parsed_options().train_markov_head:
            return drafter.draft_logits(hidden)
        return drafter.markov_logits(hidden, prev)

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)``: the chain terms and the confidence head's, see the module docstring."""
        rows = self.block_rows(drafter, target, batch, recipe)
        loss, metrics = self.chain_terms(rows, recipe)
        o: DSparkOptions = recipe.drafter.parsed_options()
        d: DSparkDrafter = rows["drafter"]
        if d.confidence_head is None or o.confidence_weight == 0:
            return loss, metrics
        n = rows["hidden"].shape[0]
        ids = d.draft_ids()
        logits, outcome, valid = [], [], []
        for s, (draft, label, prev, top) in enumerate(zip(rows["draft"], rows["label"], rows["prev"],
                                                          rows["target_top"])):
            pick = draft.detach().argmax(-1)
            pick = pick if ids is None else ids[pick]
            feats = d.norm(rows["hidden"][:, s]).detach(), d.markov_head.embed(prev).detach()  # [N, H], [N, r]
            logits.append(d.confidence_head(*feats))
            outcome.append((pick == top).float())
            valid.append(label != -100)
        z, y, v = torch.stack(logits), torch.stack(outcome), torch.stack(valid)  # [S, N]
        bce = F.binary_cross_entropy_with_logits(z, y, reduction="none")[v].sum() / max(n, 1)
        if v.any():
            metrics["confidence_bce"] = float(bce.detach()) * max(n, 1) / int(v.sum())
            metrics["confidence_acc"] = float(((z[v] > 0).float() == y[v]).float().mean())
            metrics["accepted_rate"] = float(y[v].mean())
        loss = loss + o.confidence_weight * bce
        metrics["loss"] = float(loss.detach())
        return loss, metrics
