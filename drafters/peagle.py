"""P-EAGLE: the EAGLE-3 head drafting every position of a chain in ONE forward ("P-EAGLE: Parallel-Drafting
EAGLE with Scalable Training", Hui et al., arXiv 2602.01469; served by vLLM as EAGLE-3 with
``parallel_drafting``).

The head is EAGLE-3's (:mod:`drafters.eagle3`: fc over three fused target layers, ``num_layers`` decoder layers
(the first 2H-input, the rest plain Llama layers, as vLLM stacks them), norm, LM head over a reduced draft
vocabulary with ``d2t`` / ``t2d``), plus two mask inputs for the positions whose tokens are not known yet:

* ``mask_token_id``: the token id fed there (its row of the target's frozen embedding), and
* ``mask_hidden`` ``[3H]``: a LEARNED stand-in for the fused target features, projected by the same ``fc``
  (vLLM feeds ``fc(mask_hidden)``, ``combine_hidden_states``, at every masked slot).

One round after a prefix of ``n`` committed tokens (head position ``t`` consumes ``(token t+1, feature t)`` at
RoPE position ``t`` and predicts token ``t+2``, as EAGLE-3)::

    positions  valid .. n-2                 n-1 .. n+K-3
    inputs     (tokens[t+1], fc(feat[t]))    (mask_token_id, fc(mask_hidden))  x (K-1)
    outputs    ..., out[n-2] -> draft 1      out[n-1] -> draft 2, ..., out[n+K-3] -> draft K

all in one causal pass of the layer stack: the real positions new this round (their keys/values are cached, per layer;
the masked ones are not) and the K-1 masked positions, which attend the real prefix and the earlier masked positions.
With ONE layer a masked position's query is built from the mask inputs and its RoPE position alone, so it cannot depend
on the context (only its attention output does); from the second layer on its query is built from what the first layer
read from the prefix (P-EAGLE and vLLM's speculators stack several layers; the measured effect per position is in
``docs/benchmarks/peagle.md``). A mask input is never fed at a position whose token is known. No position reads
another's draft token, so draft position ``i`` is drawn from its own distribution ``q_i`` (exact rejection sampling, as
DFlash); trees take each position's top-k (Medusa's tree shape, :meth:`PEagleDrafter.propose_tree`).

Training (:meth:`PEagleDrafter.forward`, P-EAGLE's training-time test): depth 0 at every position as EAGLE-3's
step 0; depth ``d >= 1`` of the chain started at ``t`` is the masked input at RoPE position ``t+d`` and
predicts token ``t+2+d``, attending depth-0 keys at positions ``<= t`` and the same chain's depths ``1..d``:
exactly the decoder's pass after a prefix ending at ``t``. Conditional drop-token (COD) sampling keeps a
geometrically shrinking share of the chains at each depth (``train.strategies.peagle``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from drafterkit.decode import compiled
from drafterkit.decode.dynamic_tree import DynamicTree, TreeBuilder, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.base import card_head
from drafterkit.drafters.dflash import select_parallel
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.heads.compiled_steps import warm_up
from drafterkit.drafters.heads.feature_head import trim_kv
from drafterkit.drafters.heads.layers import causal_mask

#: the fewest draft positions a compiled drafting pass computes (more than a round asks, near the end of a decode, are
#: dropped): every pass then has several rows and keeps several logits or none, the shapes of the graphs
#: :meth:`PEagleDrafter.warm_up_compiled` builds, and nothing compiles inside a timed decode
COMPILED_MIN_K = 3


@dataclass
class PEagleConfig(Eagle3Config):
    """P-EAGLE head: the EAGLE-3 fields (:class:`drafters.eagle3.Eagle3Config`) plus ``mask_token_id`` (the
    target token id embedded at masked positions) and ``num_depths`` (K, the chain positions trained; decoding
    may ask for any K, positions past ``num_depths`` were never trained)."""

    mask_token_id: int = 0
    num_depths: int = 5

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= int(self.mask_token_id) < self.vocab_size:
            raise ValueError(f"mask_token_id must be a target token id in [0, {self.vocab_size}), got "
                             f"{self.mask_token_id}")
        if int(self.num_depths) < 1:
            raise ValueError(f"num_depths must be >= 1, got {self.num_depths}")


class PEagleDrafter(Eagle3Drafter):
    """P-EAGLE head: EAGLE-3's modules plus the learned ``mask_hidden [3H]``; one head pass drafts K tokens."""

    kind = "peagle"
    config_class = PEagleConfig

    def __init__(self, config: PEagleConfig, target: nn.Module | None = None):
        super().__init__(config, target=target)
        self.mask_hidden = nn.Parameter(torch.randn(3 * config.hidden_size))  # as speculators' P-EAGLE starts it

    # --- the masked inputs ---------------------------------------------------------------------------
    def mask_inputs(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The masked positions' inputs for ``shape`` (``[m]`` or ``[B, Q]``): token ids (``mask_token_id``)
        and hidden inputs ``fc(mask_hidden)`` ``[*shape, H]``."""
        dev = self.mask_hidden.device
        ids = torch.full(shape, self.config.mask_token_id, dtype=torch.long, device=dev)
        hid = self.fc(self.mask_hidden.to(self.fc.weight.dtype))  # [H]
        return ids, hid.to(dtype).expand(*shape, -1)

    # --- training ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor,
                depths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training pass: depth 0 at every position and the masked depths of the chains in ``anchors``.

        Args:
            input_ids: ``[B, T]``. features: ``[B, T, 3H]`` (concatenated over ``feature_layers``).
            anchors: LongTensor ``[B, Q]``: the chain start ``t`` of each masked query (``-1``: padding).
            depths: LongTensor ``[B, Q]``: its depth ``d >= 1``; the query sits at RoPE position ``t + d``,
                attends depth-0 keys at positions ``<= t`` and the queries of the same chain with depths
                ``<= d``, and predicts token ``t + 2 + d``.

        Returns:
            ``(out0 [B, T, H], out_mask [B, Q, H])`` pre-norm head outputs: ``out0[:, t]`` predicts token
            ``t + 2`` (EAGLE-3's step 0); padded queries' outputs are garbage.
        """
        b, t = input_ids.shape
        dev = input_ids.device
        nxt = torch.cat([input_ids[:, 1:], input_ids.new_zeros(b, 1)], 1)  # token t+1 at position t
        ar = torch.arange(t, device=dev)
        out0, kv = self._layer(nxt, self.real_input(features), ar[None].expand(b, t), causal_mask(t, 0, dev), None)
        ids, hid = self.mask_inputs(tuple(anchors.shape), out0.dtype)
        see_real = ar[None, None, :] <= anchors[:, :, None]  # [B, Q, T]
        same = (anchors[:, :, None] == anchors[:, None, :]) & (depths[:, None, :] <= depths[:, :, None])
        same |= torch.eye(anchors.shape[1], dtype=torch.bool, device=dev)[None]  # padding sees itself
        mask = torch.cat([see_real, same], -1)[:, None]  # [B, 1, Q, T + Q]
        pos = (anchors.clamp(min=0) + depths)
        out_mask, _ = self._layer(ids, hid, pos, mask, kv)
        return out0, out_mask

    # --- decoding ------------------------------------------------------------------------------------
    def _outputs(self, rows: list[int], state: DecodeState, k: int) -> torch.Tensor:
        """Head outputs for draft positions ``1..k`` of the decoder rows ``rows`` ``[R, k, H]`` (:meth:`_drafted`)."""
        return self._drafted(rows, state, k)[0]

    def _drafted(self, rows: list[int], state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Head outputs ``[R, k, H]`` and draft logits ``[R, k, N]`` for draft positions ``1..k`` of the decoder rows
        ``rows``: per row ONE pass (:meth:`_pass`, compiled in ``decode.compiled_mode``) of the layer stack over the
        real positions new since its cache and ``k - 1`` masked positions (rows needing the same range run batched);
        caches the real keys/values only."""
        dev, dt = self.embed.weight.device, self._dtype()
        # compiled, the graph maps every input through fc (real_input): the features and mask_hidden both
        raw = compiled.drafts_compiled(self, dev)
        want, k = k, max(k, COMPILED_MIN_K) if raw else k
        groups: dict[tuple[int, int], list[int]] = {}
        for b in rows:
            n, cache = len(state.tokens[b]), self._caches[b]
            valid = 0 if cache is None else max(0, min(cache["real"], state.num_stable[b] - 1))
            groups.setdefault((valid, n), []).append(b)
        outs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if raw:
            m_ids = torch.full((k - 1,), self.config.mask_token_id, dtype=torch.long, device=dev)
            m_hid = self.mask_hidden.to(dt).expand(k - 1, -1)
        else:
            m_ids, m_hid = self.mask_inputs((k - 1,), dt)
        for (valid, n), group in groups.items():
            past = None if valid == 0 else tuple(  # per layer: the group's rows' caches cut to `valid`, stacked
                tuple(torch.cat(rows) for rows in zip(*layer))
                for layer in zip(*(trim_kv(self._caches[b]["kv"], valid) for b in group)))
            fresh = n - 1 - valid  # real positions valid .. n-2
            ids = torch.stack([torch.cat([torch.tensor(state.tokens[b][valid + 1:n], dtype=torch.long, device=dev),
                                          m_ids]) for b in group])  # [G, fresh + k - 1]
            feats = [state.features[b][valid:n - 1].to(dev, dt) for b in group]
            hid = torch.stack([torch.cat([f if raw else self.real_input(f), m_hid]) for f in feats])  # [G, ., H or 3H]
            pos = torch.arange(valid, n - 2 + k, device=dev)[None].expand(len(group), -1)
            # the logits of the last real position's output and the masked ones' (only the masked ones' when the
            # cache holds the last real output already)
            out, kv, logits = self._pass(ids, hid, pos, causal_mask(ids.shape[1], valid, dev), past, real=raw,
                                         keep=k if fresh > 0 else 0)
            for g, b in enumerate(group):
                if fresh > 0:  # every layer's keys/values of the real positions only
                    self._caches[b] = {"kv": tuple((k[g:g + 1, :, :n - 1], v[g:g + 1, :, :n - 1]) for k, v in kv),
                                       "real": n - 1, "last": out[g:g + 1, fresh - 1], "logits": logits[g:g + 1, 0]}
                    outs[b] = out[g, fresh - 1:], logits[g]
                else:  # nothing new: the cached output drafts position 1
                    cached = self._caches[b]
                    outs[b] = torch.cat([cached["last"], out[g]]), torch.cat([cached["logits"], logits[g]])
        return (torch.stack([outs[b][0][:want] for b in rows]), torch.stack([outs[b][1][:want] for b in rows]))

    def warm_up_compiled(self, k: int = 5) -> None:
        """Compile the drafting graphs a batch-1 decode of chains (and trees) of ``k`` draft tokens uses, each over a
        cache (``compiled_steps.head_pass`` runs a first pass's prefix eagerly): passes of one and of several new real
        positions before the ``k - 1`` masked ones (up to ``k + 1``, a chain all accepted and its bonus token), and one
        with none (``_drafted``)."""
        k = max(k, COMPILED_MIN_K)
        warm_up(self, ((k + 1, True, k), (2 * k, True, k), (k - 1, True, 0)), k)

    def _row_logits(self, state: DecodeState, k: int) -> tuple[list[int], torch.Tensor | None]:
        """The rows that can draft (active, >= 2 tokens) and their draft-vocabulary logits ``[R, k, N]`` (the head's
        dtype: the choice of draft tokens reads them once, :func:`drafters.dflash.select_parallel`)."""
        if state.features is None:
            raise ValueError(f"{self.kind} needs target features; the decoder must honour feature_layers")
        if not hasattr(self, "_caches") or len(self._caches) != len(state.tokens):
            self.reset(len(state.tokens))
        rows = [b for b, toks in enumerate(state.tokens) if state.active[b] and len(toks) >= 2]
        if not rows:
            return rows, None
        with torch.no_grad():
            return rows, self._drafted(rows, state, k)[1]  # [R, k, N], the head's dtype

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """``k`` draft tokens per row from one head pass each (module docstring); each position drawn from its
        own ``q_i`` (:func:`drafters.dflash.select_parallel`); ``draft_threshold`` cuts chains. Rows with
        nothing to condition on (one token) or inactive propose nothing.

        Raises:
            ValueError: the decoder passed no features.
        """
        v, b_all = self.config.vocab_size, len(state.tokens)
        last = torch.tensor([t[-1] if t[-1] < state.vocab_size else 0 for t in state.tokens])
        tokens = last[:, None].repeat(1, k)
        probs = None if sampling.greedy else torch.nn.functional.one_hot(tokens, v).float()
        lengths = torch.zeros(b_all, dtype=torch.long)
        rows, logits = self._row_logits(state, k)
        if rows:
            t, q, n = select_parallel(logits, k, sampling, generator, state.vocab_size, self.draft_ids(), v,
                                      self.draft_threshold)
            tokens[rows], lengths[rows] = t, n
            if probs is not None:
                probs[rows] = q
        return Proposal(tokens=tokens, probs=probs, lengths=lengths)

    def _position_logp(self, state: DecodeState, depth: int) -> tuple[list[int], torch.Tensor | None]:
        """Rows that can draft and their log-probabilities over the draft vocabulary ``[R, depth, N]`` (draft
        ids mapping past ``state.vocab_size`` at -inf)."""
        rows, logits = self._row_logits(state, depth)
        if logits is None:
            return rows, None
        logits = logits.float().masked_fill((self.draft_ids() >= state.vocab_size)[None, None], float("-inf"))
        return rows, torch.log_softmax(logits, -1).cpu()

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """One token per node of ``tree`` per row from ONE head pass: a node at depth ``d`` with rank ``r``
        takes the rank-``r`` token of draft position ``d`` (the positions do not read their ancestors' tokens,
        so every node at a depth shares its candidates, as Medusa's tree). With ``draft_threshold > 0`` a node
        whose path probability falls below it is masked out with its subtree; one below ``expand_threshold``
        gets no children. Deterministic: ``probs=None``.

        Returns:
            ``Proposal(tokens [B, N], mask [B, N])``; rows that cannot draft are all False.

        Raises:
            ValueError: the decoder passed no features.
        """
        b_all = len(state.tokens)
        tokens = torch.zeros(b_all, tree.num_nodes, dtype=torch.long)
        mask = torch.zeros(b_all, tree.num_nodes, dtype=torch.bool)
        rows, logp = self._position_logp(state, tree.max_depth)
        if logp is None:
            return Proposal(tokens=tokens, probs=None, mask=mask)
        top = logp.exp().topk(min(max(tree.ranks) + 1, logp.shape[-1]), -1)  # [R, D, r]
        ids = self.draft_ids().cpu()
        path_p = torch.ones(len(rows), tree.num_nodes)
        for i, (d, r, par) in enumerate(zip(tree.depths, tree.ranks, tree.parents)):
            if r >= top.indices.shape[-1]:
                continue
            tokens[rows, i] = ids[top.indices[:, d - 1, r]]
            path_p[:, i] = top.values[:, d - 1, r] * (path_p[:, par] if par >= 0 else 1.0)
            ok = (path_p[:, i] >= self.draft_threshold) & (top.values[:, d - 1, r] > 0)
            if par >= 0:  # children only under nodes that clear expand_threshold too
                ok &= mask[rows, par] & (path_p[:, par] >= self.expand_bar)
            mask[rows, i] = ok
        return Proposal(tokens=tokens, probs=None, mask=mask)

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row, an EAGLE-2 dynamic tree (:class:`decode.dynamic_tree.TreeBuilder`) over the positions of ONE
        head pass: a node at depth ``d`` takes position ``d``'s top-k as its candidates (as in
        :meth:`propose_tree`), ranked by cumulative log-probability; the best ``spec.total`` are verified.
        Deterministic: ``probs=None``.

        Raises:
            ValueError: the decoder passed no features.
        """
        rows, logp = self._position_logp(state, spec.depth)
        out = [None] * len(state.tokens)
        ids = self.draft_ids().cpu()
        for r, b in enumerate(rows):
            builder = TreeBuilder(spec, self.draft_threshold, self.expand_bar)
            frontier = [-1]
            while frontier:
                frontier = builder.add_children(logp[r, builder.level][None].expand(len(frontier), -1), ids)
            out[b] = builder.result()
        return pack_rows(out)


def card_line(cfg: dict, export_config: dict | None) -> str:
    """The model card's line on a P-EAGLE drafter whose ``config.json`` config is ``cfg`` (its export's
    config: ``export_config``; ``drafters.kinds.Kind.card_line``)."""
    shape, vocab = card_head(cfg, "decoder")
    return (f"P-EAGLE: the EAGLE-3 head ({shape}, {vocab}) with learned mask inputs (token "
            f"{cfg.get('mask_token_id')}, `mask_hidden`): one pass drafts every position of the chain "
            f"(trained on {cfg.get('num_depths')})")
