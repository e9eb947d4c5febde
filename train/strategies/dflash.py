"""Training strategy for the DFlash block drafter (``drafters.dflash``; "DFlash: Block Diffusion for Flash
Speculative Decoding", arXiv 2602.06036).

Anchors: in each sequence ``num_anchors`` block starts ``a`` are drawn uniformly without replacement among
the positions ``a >= 1`` whose next token is supervised (an assistant token); a sequence with fewer such
positions uses all of them. The block at ``a`` is ``[token a, mask x (B-1)]`` and reads the target's
features at positions ``< a`` only (``DFlashDrafter.forward``), exactly what decoding runs after a prefix of
``a + 1`` tokens; all blocks of a batch go through the drafter in one pass.

Loss: block position ``k`` (1-based) drafts token ``a + k``; it is compared with the target's distribution at
position ``a + k - 1`` (:meth:`DFlashStrategy.block_rows`; its LM head on the final-norm state there), restricted to
the draft vocabulary for a reduced one (as EAGLE-3: a row whose target argmax lies outside it is dropped), assuming
the accepted tokens equal the data tokens (exact on data the target generated greedily, ``data.regenerate: true``).
Every term of ``recipe.loss`` applies per position with weight ``exp(-(k - 1) / position_weight_gamma)`` (DFlash's
decaying weights), each a sum over its rows divided by the number of blocks (``train.strategies.heads.chain_loss``);
``accept_len`` chains the first ``min(B - 1, loss.draft_steps)`` positions: a block IS the chain the decoder
verifies (its positions do not read each other's draft tokens, so no unroll is needed).

Build: the draft layers start from the target's last ``num_layers`` decoder layers (``init_from_target_layer``;
q/k norms start at ones), ``fc`` passes the last feature layer through (``init_fc: last_feature``); a reduced
draft vocabulary is the ``draft_vocab_size`` most frequent supervised tokens of the training data, its LM head
rows and the final norm started from the target's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.eagle3 import copy_final_norm, select_draft_vocab
from drafterkit.drafters.target.layers import (
    copy_matching,
    decoder_layers,
    layer_config,
    llama_layer_tensors,
    source_layer_ids,
)
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.features import target_logits
from drafterkit.train.options import DFlashOptions, draft_vocab_refusal
from drafterkit.train.strategies.eagle3 import init_fc_last_feature
from drafterkit.train.strategies.heads import (
    FeatureHeadStrategy,
    chain_loss,
    count_data_tokens,
    trainable_own,
)


def sample_anchors(labels: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Block starts per row: ``count`` positions ``a >= 1`` with ``labels[b, a] != -100`` (token ``a+1``
    supervised), drawn uniformly without replacement, sorted; ``-1`` fills rows with fewer. ``[B, T] -> [B, count]``."""
    ok = labels != -100
    ok[:, 0] = False
    score = torch.rand(labels.shape, generator=generator, device="cpu").to(labels.device)
    score = torch.where(ok, score, torch.full_like(score, -1.0))
    top = score.topk(min(count, labels.shape[1]), dim=1)
    anchors = torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))
    anchors = torch.where(anchors < 0, torch.full_like(anchors, labels.shape[1]), anchors).sort(1).values
    return anchors.masked_fill(anchors == labels.shape[1], -1)


@torch.no_grad()
def init_layers_from_target(drafter: DFlashDrafter, target: torch.nn.Module) -> None:
    """Copy the target's last ``num_layers`` decoder layers whose attention maps (a hybrid target's last
    full-attention layers; ``drafters.target.layers.source_layer_ids``) into the last draft layers, where they map,
    any family (``drafters.target.layers``: fused projections split, norms by effective scale, per-head q/k norms
    where the target has them; post-norms, MoE MLPs and whole-width q/k norms (OLMo-2) keep the default init).
    Draft layers with no such target layer left (fewer attention layers than draft layers; none for DeepSeek's
    latent attention) keep their fresh init, as training's one line says (``fresh_init_note``)."""
    ids = source_layer_ids(target, len(drafter.layers))
    layers = decoder_layers(target)
    for mine, i in zip(list(drafter.layers)[len(drafter.layers) - len(ids):], ids):
        copy_matching(mine, llama_layer_tensors(layers[i], layer_config(target.config, i)))


class DFlashStrategy(FeatureHeadStrategy):
    """Strategy (see ``train.strategies``) for ``kind: dflash``."""

    kind = "dflash"
    options_model = DFlashOptions
    drafter_class = DFlashDrafter
    min_tokens = 3

    def config(self, recipe: Any, target: torch.nn.Module) -> DFlashConfig:
        o: DFlashOptions = recipe.drafter.parsed_options()
        if why := draft_vocab_refusal(o, target.config.vocab_size):  # a target whose config was not local
            raise ValueError(why)
        return DFlashConfig.from_target(target, num_layers=o.num_layers, block_size=o.block_size,
                                        draft_vocab_size=o.draft_vocab_size or 0, mask_token_id=o.mask_token_id,
                                        feature_layers=list(o.feature_layers or []))

    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        o: DFlashOptions = recipe.drafter.parsed_options()
        cfg = self.config(recipe, target)
        drafter = self.drafter_class(cfg, target=target)
        if drafter.full_vocab:
            copy_final_norm(drafter, target)
        else:
            counts = count_data_tokens(recipe, target, tokenizer, cfg.vocab_size)
            drafter.set_draft_vocab(select_draft_vocab(counts, cfg.draft_vocab_size), target=target)
        if o.init_from_target_layer:
            init_layers_from_target(drafter, target)
        if o.init_fc == "last_feature":
            init_fc_last_feature(drafter)
        return trainable_own(drafter, target)

    def feature_layers(self, recipe: Any, target: torch.nn.Module) -> list[int]:
        """The fused layers and the last one (its LM head gives the target's logits): what :meth:`loss` reads."""
        cfg = self.config(recipe, target)
        return list(cfg.feature_layers) + [cfg.target_num_layers]

    def units(self, batch: dict[str, Any], recipe: Any) -> int:
        """The blocks :meth:`loss` averages over (``metrics["tokens"]``), from the batch alone: per row,
        ``min(num_anchors, positions a >= 1 whose token a + 1 is supervised)`` (what :func:`sample_anchors`
        draws, whichever positions it picks)."""
        o: DFlashOptions = recipe.drafter.parsed_options()
        ok = shift_for_next_token(batch) != -100  # [B, T]
        ok[:, 0] = False
        return int(ok.sum(1).clamp(max=min(o.num_anchors, ok.shape[1])).sum())

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)`` over the blocks after sampled anchors, see the module docstring."""
        rows = self.block_rows(drafter, target, batch, recipe)
        return self.chain_terms(rows, recipe)

    def chain_terms(self, rows: dict[str, Any], recipe: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """``recipe.loss`` over :meth:`block_rows`' positions, position ``s`` (0-based) weighted
        ``exp(-s / position_weight_gamma)``."""
        o: DFlashOptions = recipe.drafter.parsed_options()
        weights = [math.exp(-s / o.position_weight_gamma) for s in range(len(rows["draft"]))]
        loss, metrics = chain_loss(rows["draft"], rows["target"], rows["label"], weights, recipe.loss)
        if rows["covered"]:
            cov = torch.cat(rows["covered"]).float()
            metrics["draft_vocab_coverage"] = float(cov.mean()) if cov.numel() else 0.0
        return loss, metrics

    def slot_logits(self, drafter: DFlashDrafter, hidden: torch.Tensor, prev: torch.Tensor,
                    recipe: Any) -> torch.Tensor:
        """Draft logits ``[N, Nv]`` of one block position's outputs ``hidden [N, H]``; ``prev [N]``: the data token
        before the drafted one (unused by DFlash, whose positions do not read each other)."""
        return drafter.draft_logits(hidden)

    def block_rows(self, drafter, target, batch, recipe) -> dict[str, Any]:
        """Per block position ``s`` (0-based, drafting token ``a + s + 1`` after anchor ``a``) over the sampled
        blocks' N rows: ``draft`` / ``target`` logits ``[N, Nv]`` (draft vocabulary), ``label`` ``[N]`` (-100 where
        unsupervised or, reduced vocabulary, the target's argmax lies outside it), ``prev`` ``[N]`` (token
        ``a + s``), ``target_top`` ``[N]`` (the target's argmax, a target id), lists over positions; ``hidden``
        ``[N, S, H]`` (pre-norm), ``covered`` (reduced vocabulary: in-vocabulary flags) and ``drafter``."""
        d, fused, last = self.fused_features(drafter, target, batch, recipe)  # [B, T, nF H], [B, T, H]
        o: DFlashOptions = recipe.drafter.parsed_options()
        ids, labels = batch["input_ids"], shift_for_next_token(batch)  # [B, T]
        anchors = sample_anchors(labels, o.num_anchors)  # [B, A]
        hidden = drafter(ids, fused, anchors, return_hidden=True)  # [B, A, S, H]
        rows = torch.nonzero(anchors >= 0, as_tuple=True)
        b_idx, a_pos = rows[0], anchors[rows]  # [N]
        hidden = hidden[rows]  # [N, S, H]
        draft_ids = d.draft_ids()
        label_draft = None if draft_ids is None else torch.cumsum(d.t2d.long(), 0) - 1  # target id -> draft id
        out: dict[str, Any] = {"draft": [], "target": [], "label": [], "prev": [], "target_top": [], "covered": [],
                               "hidden": hidden, "drafter": d}
        for s in range(d.draft_slots):
            p = a_pos + s  # the target's state there predicts token a + s + 1
            inside = p < ids.shape[1]
            pc = p.clamp(max=ids.shape[1] - 1)
            y = torch.where(inside, labels[b_idx, pc], torch.full_like(pc, -100))
            t_full = target_logits(target, last[b_idx, pc]).float()  # [N, V]
            ok = y != -100
            if draft_ids is None:
                t_k, y_k = t_full, y
            else:
                in_vocab = d.t2d[t_full.argmax(-1)]
                out["covered"].append(in_vocab[ok])
                ok = ok & in_vocab
                t_k = t_full[:, draft_ids]
                yc = y.clamp(min=0)
                y_k = torch.where(d.t2d[yc], label_draft[yc], t_k.argmax(-1))
            prev = ids[b_idx, pc]
            out["draft"].append(self.slot_logits(d, hidden[:, s], prev, recipe).float())
            out["target"].append(t_k)
            out["label"].append(torch.where(ok, y_k, torch.full_like(y_k, -100)))
            out["prev"].append(prev)
            out["target_top"].append(t_full.argmax(-1))
        return out
