"""Training strategy for the P-EAGLE head (``drafters.peagle``; "P-EAGLE: Parallel-Drafting EAGLE with Scalable
Training", Hui et al., arXiv 2602.01469; speculators' and SpecForge's ``peagle``).

Build: as EAGLE-3 (:class:`train.strategies.eagle3.Eagle3Strategy`: the draft vocabulary of the most frequent
supervised tokens, every weight started from the target's), plus ``mask_token_id`` and the learned
``mask_hidden``.

Training-time test, as P-EAGLE prescribes: the head is trained on exactly the inputs decoding feeds it. Depth 0
at every position ``t`` reads ``(token t+1, features t)`` (EAGLE-3's step 0) and predicts token ``t+2``; depth
``d >= 1`` of the chain started at ``t`` reads the MASK inputs at RoPE position ``t+d``, attends the real prefix
``<= t`` and its own chain's depths ``<= d``, and predicts token ``t+2+d`` (``PEagleDrafter.forward``, one
pass over all of them). No position reads a token the decoder would not know, so there is no choice between
data and draft tokens to make (EAGLE-3's ``ttt_tokens``): the training chain is the decoded chain, as long as
the accepted tokens are the data's (exact on the target's own greedy outputs, ``data.regenerate: true``).

Conditional drop-token (COD) sampling: every supervised position starts a chain; depth ``d >= 1`` keeps a
random ``max(down_sample_ratio ** d, down_sample_ratio_min)`` of a sequence's chains, nested (a chain kept at
depth ``d`` was kept at ``d - 1``), so deep positions cost a shrinking share of the pass (speculators'
``generate_cod_sample_indices`` draws the same shares; its candidates are shifted data positions, ours chains).

Loss: depth ``d`` is compared with the target's distribution at position ``t+1+d`` restricted to the draft
vocabulary (rows whose target argmax lies outside it dropped, as EAGLE-3); every ``recipe.loss`` term applies per
depth with weight ``step_weight_decay ** d``, a sum over the kept rows divided by the number of chain starts
(``train.strategies.heads.chain_loss``). ``accept_len`` chains depths ``0 .. min(num_depths, draft_steps) - 1``;
a chain not kept at depth ``d`` ends there (its expected length counts the depths it kept).
"""

from __future__ import annotations

from typing import Any

import torch

from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.options import PEagleOptions, draft_vocab_for, draft_vocab_refusal
from drafterkit.train.strategies.eagle3 import (
    Eagle3Strategy,
    restricted_target,
    start_from_target,
)
from drafterkit.train.strategies.heads import chain_loss, shifted_rows


def cod_queries(chain: torch.Tensor, num_depths: int, ratio: float, ratio_min: float,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked queries of COD sampling: per row, depth ``d = 1 .. num_depths - 1`` keeps the first
    ``round(n * max(ratio ** d, ratio_min))`` (at least 1) of the row's ``n`` chain starts in one random order.

    Args:
        chain: bool ``[B, T]``, True where a chain starts (depth 0 supervised).

    Returns:
        ``(anchors [B, Q], depths [B, Q])`` LongTensors, ``-1`` / ``1`` padding rows with fewer queries.
    """
    rows = []
    for b in range(chain.shape[0]):
        starts = torch.nonzero(chain[b]).flatten().cpu()
        order = starts[torch.randperm(starts.numel(), generator=generator)]
        anchors, depths = [], []
        for d in range(1, num_depths):
            keep = max(1, round(order.numel() * max(ratio ** d, ratio_min))) if order.numel() else 0
            anchors.append(order[:keep])
            depths.append(torch.full((keep,), d, dtype=torch.long))
        rows.append((torch.cat(anchors) if anchors else torch.zeros(0, dtype=torch.long),
                     torch.cat(depths) if depths else torch.zeros(0, dtype=torch.long)))
    q = max(1, max(a.numel() for a, _ in rows))
    anchors = torch.full((chain.shape[0], q), -1, dtype=torch.long)
    depths = torch.ones((chain.shape[0], q), dtype=torch.long)
    for b, (a, d) in enumerate(rows):
        anchors[b, :a.numel()], depths[b, :d.numel()] = a, d
    return anchors.to(chain.device), depths.to(chain.device)


class PEagleStrategy(Eagle3Strategy):
    """Strategy (see ``train.strategies``) for ``kind: peagle``."""

    kind = "peagle"
    options_model = PEagleOptions

    def config(self, recipe: Any, target: torch.nn.Module) -> PEagleConfig:
        o: PEagleOptions = recipe.drafter.parsed_options()
        if why := draft_vocab_refusal(o, target.config.vocab_size):  # a target whose config was not local
            raise ValueError(why)
        return PEagleConfig.from_target(target, draft_vocab_size=draft_vocab_for(o, target.config.vocab_size),
                                        feature_layers=list(o.feature_layers or []), num_depths=o.num_depths,
                                        mask_token_id=o.mask_token_id, num_layers=o.num_layers)

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        o: PEagleOptions = recipe.drafter.parsed_options()
        cfg = self.config(recipe, target)
        return start_from_target(PEagleDrafter(cfg, target=target), o, recipe, target, tokenizer)

    def feature_layers(self, recipe: Any, target: torch.nn.Module) -> list[int]:
        """The three fused layers and the last one (its LM head gives the target's logits)."""
        cfg = self.config(recipe, target)
        return list(cfg.feature_layers) + [cfg.target_num_layers]

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)`` over depth 0 and the COD-sampled masked depths, see the module docstring."""
        d, fused, last = self.fused_features(drafter, target, batch, recipe)  # [B, T, 3H], [B, T, H]
        o: PEagleOptions = recipe.drafter.parsed_options()
        ids, labels = batch["input_ids"], shift_for_next_token(batch)  # [B, T]
        chain = torch.zeros_like(labels, dtype=torch.bool)
        chain[:, :-1] = labels[:, 1:] != -100  # depth 0 supervised at t: token t+2
        anchors, depths = cod_queries(chain, o.num_depths, o.down_sample_ratio, o.down_sample_ratio_min)
        out0, out_mask = drafter(ids, fused, anchors, depths)  # [B, T, H], [B, Q, H]
        where = torch.full((*ids.shape, o.num_depths), -1, dtype=torch.long, device=ids.device)  # [B, T, K]
        real = anchors >= 0
        b_q = torch.nonzero(real, as_tuple=True)
        where[b_q[0], anchors[real], depths[real]] = b_q[1]  # query index of (row, chain start, depth)
        t_rows, in_vocab, index = restricted_target(target, last, labels, d)
        label_draft = torch.cumsum(d.t2d.long(), 0) - 1  # target id -> draft id (where t2d)
        starts = torch.nonzero(chain, as_tuple=True)
        n = starts[0].numel()
        draft_rows, target_rows, label_rows = [], [], []
        for j in range(o.num_depths):
            if j == 0:
                kept, logits = torch.ones(n, dtype=torch.bool, device=ids.device), d.draft_logits(out0[starts]).float()
            else:
                q = where[starts[0], starts[1], j]  # [N]
                kept = q >= 0
                rows = d.draft_logits(out_mask[starts[0][kept], q[kept]]).float()  # [kept, Nd]
                logits = rows.new_zeros(n, rows.shape[-1]).index_put((torch.nonzero(kept).flatten(),), rows)
            y = shifted_rows(labels, starts, j + 1, fill=-100)  # data token t+2+j (target id)
            r = shifted_rows(index, starts, j + 1, fill=-1)  # row of position t+1+j in t_rows
            ok = (y != -100) & (r >= 0) & kept
            ok = ok & in_vocab[r.clamp(min=0)]
            t_j = t_rows[r.clamp(min=0)]  # [N, Nd]
            yc = y.clamp(min=0)
            y_d = torch.where(d.t2d[yc], label_draft[yc], t_j.argmax(-1))  # ce on data labels only reads it
            draft_rows.append(logits)
            target_rows.append(t_j)
            label_rows.append(torch.where(ok, y_d, -100))
        weights = [o.step_weight_decay ** j for j in range(o.num_depths)]
        loss, metrics = chain_loss(draft_rows, target_rows, label_rows, weights, recipe.loss)
        metrics["draft_vocab_coverage"] = float(in_vocab.float().mean()) if in_vocab.numel() else 0.0
        metrics["cod_queries"] = float(real.sum())
        return loss, metrics


__all__ = ["PEagleStrategy", "cod_queries"]
