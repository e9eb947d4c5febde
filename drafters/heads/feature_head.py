"""The feature-level head's decoding, shared by EAGLE (:mod:`drafters.eagle`) and EAGLE-3
(:mod:`drafters.eagle3`): :class:`FeatureHeadDrafter` runs a head of one or more decoder layers autoregressively over
its own predicted features with one KV cache per row and layer (RoPE positions = token positions), re-synchronising with
the target's real features of accepted tokens each round through ``state.num_stable``, and proposes chains, static trees
and dynamic trees (EAGLE-2, Li et al. 2024) from it; its training-time-test unroll (:meth:`FeatureHeadDrafter.unroll`,
EAGLE-3, Li et al. 2025) runs the same chain at every position at once.

Why here and not in each kind's module: EAGLE-3 decodes exactly as EAGLE does (the EAGLE-3 paper keeps
EAGLE-2's drafting); the kinds differ only in what the head reads and writes, which each kind's module
supplies through two hooks (``real_input``: target features -> the head's input; ``logits_and_ids``: head
output -> logits over the draft vocabulary and the target id of each draft id). Written twice, the
decoding would drift apart; so each kind's module holds its config, its layers and those hooks, and this
module the one decoding both run.

Also here: the target-shape helpers both kinds (and Medusa, DFlash) use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafterkit.decode.cutoff import ChainCutoff
from drafterkit.decode.dynamic_tree import DynamicTree, RowTree, TreeBuilder, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.decode.sampling import mask_unproposable, select_tokens
from drafterkit.decode.tree import level_mask
from drafterkit.drafters.base import Drafter
from drafterkit.drafters.heads.compiled_steps import head_pass, warm_up
from drafterkit.drafters.heads.layers import (
    DraftDecoderLayer,
    causal_mask,
    rope_theta_of,
    ttt_attention_mask,
)
from drafterkit.drafters.target.layers import (
    copy_matching,
    decoder_layers,
    layer_config,
    llama_layer_tensors,
    source_layer_ids,
)


def check_target_shape(drafter: Drafter, target: nn.Module) -> None:
    """Raise ``ValueError`` unless ``target`` has the hidden size and layer count the feature-level
    ``drafter`` was built for (checked by ``decode.generate`` before any token is generated)."""
    c, tc = drafter.config, target.config
    got = (getattr(tc, "hidden_size", None), getattr(tc, "num_hidden_layers", None))
    if got != (c.hidden_size, c.target_num_layers):
        raise ValueError(f"this {drafter.kind} drafter reads features of a target with hidden size {c.hidden_size} "
                         f"and {c.target_num_layers} layers, but the target has hidden size {got[0]} and {got[1]} "
                         "layers; train the drafter for this target")


# --------------------------------------------------------------------------------------------------
# per-row autoregressive runner shared by EAGLE and EAGLE-3


class FeatureHeadDrafter(Drafter):
    """A head of one or more decoder layers run autoregressively at decode time with one KV cache per row
    and layer.

    Subclasses provide ``embed``, ``layer`` (the first decoder layer; :meth:`draft_layers` lists the stack),
    ``real_input(features [1, m, F]) -> [1, m, H]`` and ``logits_and_ids(out [B, H]) -> (logits [B, V'],
    ids [V'] or None)``. Head position ``t`` consumes ``(tokens[t+1], features[t])`` and its output (the
    residual stream after the last layer) predicts ``tokens[t+2]``.

    KV caches (``past``) are tuples with one ``(k, v)`` per layer, each ``[B, n_kv, S, d]``; row ``b``'s cache
    is ``self._caches[b] = {"kv": past, "real": positions cached, "last": output at the last one [1, H], "logits":
    its draft logits [1, V']}``. Every drafting pass (:meth:`_pass`) runs the layers and the LM head compiled in
    ``decode.compiled_mode`` (``drafters/heads/compiled_steps.py``), and a greedy chain one call a round.
    """

    supports_draft_threshold = True
    #: drafting passes run compiled in ``decode.compiled_mode`` (``decode.compiled.runs_compiled``)
    compiled_steps = True

    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        super().check_compatible(target, vocab_size)
        check_target_shape(self, target)

    def reset(self, batch_size: int) -> None:
        self._caches: list[dict | None] = [None] * batch_size

    def draft_layers(self) -> list[DraftDecoderLayer]:
        """The head's decoder layers in order (one unless the kind stacks more)."""
        return [self.layer]

    def _layer(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past):
        """The head (every layer of :meth:`draft_layers`) over new positions: ``ids [B, m]`` (the token each
        consumes), ``hidden [B, m, H]`` (the feature each consumes), ``positions [B, m]``, ``mask [m, S]`` or
        ``[B, 1, m, S]`` bool, ``past`` per-layer ``(k, v)`` or None -> ``(out [B, m, H], per-layer (k, v))``.
        Layer 0 reads the token embeddings; later layers read the residual stream only (vLLM's EAGLE-3)."""
        embeds = self.embed(ids).to(hidden.dtype)
        kvs = []
        for i, layer in enumerate(self.draft_layers()):
            hidden, kv = layer(hidden, positions, mask, None if past is None else past[i], embeds=embeds)
            kvs.append(kv)
        return hidden, tuple(kvs)

    def _pass(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past,
              real: bool = False, keep: int = 1):
        """One drafting pass: :meth:`_layer` over new positions (``hidden`` through :meth:`real_input` first when
        ``real``) and the draft logits of its last ``keep`` outputs (0: all) -> ``(out [B, m, H], per-layer (k, v),
        logits [B, keep or m, V'])``; compiled in ``decode.compiled_mode`` (``compiled_steps.head_pass``)."""
        got = head_pass(self, ids, hidden, positions, mask, past, real, keep)
        if got is not None:
            return got
        out, kv = self._layer(ids, self.real_input(hidden) if real else hidden, positions, mask, past)
        return out, kv, self.logits_and_ids(out[:, -keep:] if keep else out)[0]

    def _step(self, ids: torch.Tensor, hidden: torch.Tensor, start: int, past, real: bool = False):
        """:meth:`_pass` over ``m`` new positions ``start..start+m-1`` (causal), ``ids [1, m]``, keeping the last
        one's logits."""
        m = ids.shape[1]
        pos = torch.arange(start, start + m, device=ids.device)[None]
        return self._pass(ids, hidden, pos, causal_mask(m, kv_len(past), ids.device), past, real=real)

    def warm_up_compiled(self, k: int = 5) -> None:
        """Compile every drafting graph a batch-1 decode with chains of ``k`` draft tokens (and trees) uses
        (``compiled_steps.warm_up``); called by ``decode.warm.warm_up_proposer`` in ``decode.compiled_mode``. Greedy
        chains of fewer tokens (the last rounds of a decode) then draft ``k`` and keep what they need."""
        self._chain_k = k
        warm_up(self, k=k)

    def draft_id_map(self) -> torch.Tensor | None:
        """The target id of each draft-vocabulary id ``[V']`` (what :meth:`logits_and_ids` returns beside the
        logits), or None when the head drafts over the target's vocabulary."""
        return None

    def _catch_up(self, b: int, tokens: list[int], feats: torch.Tensor, stable: int):
        """Bring row ``b``'s cache to the real prefix; return the head output at position ``n-2`` ``[1, H]`` and its
        draft logits ``[1, V']``."""
        dev, dt = self.embed.weight.device, self._dtype()
        n = len(tokens)
        cache = self._caches[b]
        valid = 0 if cache is None else max(0, min(cache["real"], stable - 1))
        past = trim_kv(cache["kv"], valid) if valid > 0 else None
        if valid == n - 1 and cache is not None and cache["real"] == valid:
            return cache["last"], cache["logits"]
        ids = torch.tensor(tokens[valid + 1:n], device=dev)[None]
        out, kv, logits = self._step(ids, feats[valid:n - 1].to(dev, dt)[None], valid, past, real=True)
        self._caches[b] = {"kv": kv, "real": n - 1, "last": out[:, -1], "logits": logits[:, -1]}
        return out[:, -1], logits[:, -1]

    def _chained(self, b: int, tokens: list[int], feats: torch.Tensor, stable: int, k: int,
                 vocab_size: int) -> torch.Tensor | None:
        """Row ``b``'s greedy chain ``[k]`` drafted by one compiled call (``compiled_steps.head_pass`` with
        ``chain``: the catch-up and every drafting step in one graph), the cache brought to the real prefix as
        :meth:`_catch_up` does; None where that does not run (not compiled, nothing new to catch up on), and the
        caller drafts a step at a time."""
        dev, dt = self.embed.weight.device, self._dtype()
        n, cache = len(tokens), self._caches[b]
        valid = 0 if cache is None else max(0, min(cache["real"], stable - 1))
        if valid >= n - 1:
            return None
        past = trim_kv(cache["kv"], valid) if valid > 0 else None
        ids = torch.tensor(tokens[valid + 1:n], device=dev)[None]
        m = ids.shape[1]
        got = head_pass(self, ids, feats[valid:n - 1].to(dev, dt)[None], torch.arange(valid, n - 1, device=dev)[None],
                        causal_mask(m, kv_len(past), dev), past, True, 1, max(k, getattr(self, "_chain_k", 0)),
                        vocab_size)
        if got is None:
            return None
        drafted, kv, out, logits = got
        self._caches[b] = {"kv": kv, "real": n - 1, "last": out[:, -1], "logits": logits[:, -1]}
        return drafted[0, :k].cpu()

    def _dtype(self) -> torch.dtype:
        return next(self.layer.parameters()).dtype

    # --- training: the training-time-test unroll ---------------------------------------------------
    def unroll(self, input_ids: torch.Tensor, features: torch.Tensor, steps: int, feed: str = "data",
               keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The head unrolled ``steps`` steps at every position at once (training-time test, EAGLE-3,
        Li et al. 2025): what :meth:`propose` runs after a real prefix ending at each position.

        Step 0 at position ``t`` consumes ``(token t+1, features[t])`` (through :meth:`real_input`) at
        RoPE position ``t``. Step ``j >= 1`` at ``t`` consumes the head's own step ``j-1`` output at ``t``
        and a token (``feed``), sits at RoPE position ``t+j`` and attends the step-0 keys at positions
        ``<= t`` (the real prefix) and its own steps ``1..j`` at the same ``t`` (:func:`ttt_attention_mask`),
        as the decoder's KV cache holds them. Output ``j`` at ``t`` predicts token ``t+2+j``.

        Args:
            input_ids: ``[B, T]``. features: ``[B, T, F]`` the target features the kind reads.
            steps: unroll length (>= 1).
            feed: the token of step ``j >= 1``: ``"data"`` = the data token ``t+1+j`` (teacher-forced),
                ``"draft"`` = the head's own greedy draft of step ``j-1`` (a target id, detached), which
                is what decoding feeds.
            keep: optional bool ``[B, T]``: positions whose chains are used; greedy drafts elsewhere are
                not computed (token 0), which only saves the LM head there (each chain reads its own
                position's steps only).

        Returns:
            ``steps`` pre-norm head outputs ``[B, T, H]`` (entries whose tokens run past the sequence
            are garbage; mask them).

        Raises:
            ValueError: ``steps < 1`` or an unknown ``feed``.
        """
        if steps < 1 or feed not in ("data", "draft"):
            raise ValueError(f"unroll needs steps >= 1 and feed 'data' or 'draft', got {steps}, {feed!r}")
        b, t = input_ids.shape
        hidden = self.real_input(features)  # [B, T, H]
        ids_ext = torch.cat([input_ids, input_ids.new_zeros(b, steps)], 1)  # padding past the end
        ar = torch.arange(t, device=input_ids.device)
        past, outs = None, []
        for j in range(steps):
            if j == 0 or feed == "data":
                ids_j = ids_ext[:, 1 + j: 1 + j + t]  # token t+1+j at position t
            else:
                ids_j = self.greedy_drafts(outs[-1], keep)  # the draft step j-1 proposed at t
            mask = ttt_attention_mask(t, j, input_ids.device)
            out, past = self._layer(ids_j, hidden, (ar + j)[None].expand(b, t), mask, past)
            outs.append(out)
            hidden = out
        return outs

    @torch.no_grad()
    def greedy_drafts(self, out: torch.Tensor, keep: torch.Tensor | None = None, chunk: int = 256) -> torch.Tensor:
        """The greedy draft token (a target id) of head outputs ``out [B, T, H]`` -> ``[B, T]`` long, as
        :meth:`propose` picks it (argmax of :meth:`logits_and_ids`, mapped to target ids); 0 where
        ``keep [B, T]`` is False. Rows go through the LM head ``chunk`` at a time (bounded memory)."""
        tokens = torch.zeros(out.shape[:-1], dtype=torch.long, device=out.device)
        sel = keep.bool() if keep is not None else torch.ones_like(tokens, dtype=torch.bool)
        rows = out[sel]  # [M, H]
        picked = []
        for part in rows.split(chunk):
            logits, ids = self.logits_and_ids(part)
            a = logits.float().argmax(-1)
            picked.append(a if ids is None else ids[a])
        if picked:
            tokens[sel] = torch.cat(picked)
        return tokens

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """``k`` draft tokens per row by running the head over its own features (see module docstring).

        Raises:
            ValueError: the decoder passed no features (``feature_layers`` was ignored).
        """
        if state.features is None:
            raise ValueError(f"{self.kind} needs target features; the decoder must honour feature_layers")
        if not hasattr(self, "_caches") or len(self._caches) != len(state.tokens):
            self.reset(len(state.tokens))
        rows_t, rows_p, lengths = [], [], []
        with torch.no_grad():
            for b, toks in enumerate(state.tokens):
                t, p, n = self._propose_row(b, toks, state.features[b], state.num_stable[b], k, sampling,
                                            generator, state.vocab_size, state.active[b])
                rows_t.append(t)
                rows_p.append(p)
                lengths.append(n)
        tokens = torch.stack(rows_t)
        return Proposal(tokens=tokens, probs=None if sampling.greedy else torch.stack(rows_p),
                        lengths=torch.tensor(lengths) if self.draft_threshold > 0 else None)

    def _propose_row(self, b, toks, feats, stable, k, sampling, generator, vocab_size, active):
        """Row ``b``'s chain: ``(tokens [k], q [k, V] or None, proposed length)``; past the length
        (``draft_threshold`` cut, see ``drafters.base.ChainCutoff``) tokens repeat the last one."""
        v_out = self.target_vocab_size()
        if len(toks) < 2 or not active:  # nothing to condition on yet: repeat the last token (valid id)
            t = torch.full((k,), toks[-1] if toks[-1] < vocab_size else 0, dtype=torch.long)
            return t, F.one_hot(t, v_out).float(), k if len(toks) < 2 else 0
        if sampling.greedy and self.draft_threshold <= 0 and (got := self._chained(b, toks, feats, stable, k,
                                                                                   vocab_size)) is not None:
            return got, None, k
        n = len(toks)
        hid, logits = self._catch_up(b, toks, feats, stable)  # [1, H], [1, V']: predicts tokens[n]
        past, ids = self._caches[b]["kv"], self.draft_id_map()
        drafted, probs = [], []
        cut = ChainCutoff(self.draft_threshold, 1, k)
        for i in range(k):
            if ids is not None:  # reduced draft vocabulary: mask draft ids mapping past vocab_size
                logits = mask_unproposable(logits, ids, vocab_size)
            tok, p = select_tokens(logits, sampling, vocab_size if ids is None else None, generator)
            cut.update(i, tok, logits=logits, probs=p)
            if cut.done:
                break
            tgt = tok if ids is None else ids[tok]
            drafted.append(int(tgt))
            if not sampling.greedy:
                probs.append(self._to_target_probs(p[0], ids, v_out))
            if i + 1 < k:  # next position (n-2)+i+1 consumes (draft token, own output feature)
                hid, past, logits = self._step(tgt.view(1, 1), hid[:, None], n - 1 + i, past)
                hid, logits = hid[:, -1], logits[:, -1]
        length = len(drafted)
        fill = drafted[-1] if drafted else (toks[-1] if toks[-1] < vocab_size else 0)
        t = torch.tensor(drafted + [fill] * (k - length), dtype=torch.long)
        if not sampling.greedy:
            device = probs[0].device if probs else "cpu"
            probs += [F.one_hot(torch.tensor(fill), v_out).float().to(device)] * (k - length)
        return t, (torch.stack(probs).cpu() if probs else None), length

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """One token per node of ``tree`` (a ``decode.tree.DraftTree``) per row: the head's rank-r
        candidate after the node's ancestors, drafted level by level (EAGLE-1/EAGLE-2 tree drafting,
        Li et al. 2024): each level is ONE head pass over the level's nodes under tree attention (each
        node sees the row's real prefix, its ancestors and itself; position = its depth). With
        ``draft_threshold > 0`` a node whose path probability under the head (product of its tokens'
        softmax probabilities) falls below it is masked out, with its subtree (EAGLE-2's confidence as
        an acceptance estimate); one below ``expand_threshold`` is proposed as a leaf (no head pass
        drafts its children). Deterministic (top-k): ``probs=None``.

        Returns:
            ``Proposal(tokens [B, N], mask [B, N])``; rows with nothing to condition on, or inactive, are
            all False.

        Raises:
            ValueError: the decoder passed no features.
        """
        if state.features is None:
            raise ValueError(f"{self.kind} needs target features; the decoder must honour feature_layers")
        if not hasattr(self, "_caches") or len(self._caches) != len(state.tokens):
            self.reset(len(state.tokens))
        b_all, n_nodes = len(state.tokens), tree.num_nodes
        tokens = torch.zeros(b_all, n_nodes, dtype=torch.long)
        mask = torch.zeros(b_all, n_nodes, dtype=torch.bool)
        with torch.no_grad():
            for b, toks in enumerate(state.tokens):
                if state.active[b] and len(toks) >= 2:
                    tokens[b], mask[b] = self._tree_row(b, toks, state.features[b], state.num_stable[b], tree,
                                                        state.vocab_size)
        return Proposal(tokens=tokens, probs=None, mask=mask)

    def _tree_row(self, b, toks, feats, stable, tree, vocab_size) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(toks)
        root, root_logits = self._catch_up(b, toks, feats, stable)  # [1, H], [1, V']: predicts tokens[n]
        past = self._caches[b]["kv"]
        plen = kv_len(past)
        dev = root.device
        out_tok, ok, path_p = [0] * tree.num_nodes, [False] * tree.num_nodes, {-1: 1.0}
        bar = self.expand_bar  # nodes below it stay leaves
        outs: dict[int, torch.Tensor] = {-1: root}  # head output per expanded node
        logit_of: dict[int, torch.Tensor] = {-1: root_logits}  # and its draft logits [1, V']
        ids = self.draft_id_map()
        col: dict[int, int] = {}  # expanded node -> its column among the tree's head-cache entries
        levels: dict[int, list[int]] = {}
        for i, d in enumerate(tree.depths):
            levels.setdefault(d, []).append(i)
        for d in range(1, tree.max_depth + 1):
            level = [i for i in levels.get(d, []) if tree.parents[i] in outs]
            if not level:
                break
            parents = sorted({tree.parents[i] for i in level})
            logits = torch.cat([logit_of[p] for p in parents])  # [P, V']
            if ids is not None:
                logits = mask_unproposable(logits, ids, vocab_size)
            else:
                logits = logits[:, :vocab_size]
            probs = torch.softmax(logits.float(), -1)
            top = probs.topk(min(max(tree.ranks[i] for i in level) + 1, probs.shape[-1]), -1)
            vals, idx = top.values.tolist(), top.indices
            tgt = idx if ids is None else ids[idx]
            tgt = tgt.tolist()
            for i in level:
                pi, r = parents.index(tree.parents[i]), tree.ranks[i]
                if r >= len(vals[pi]):
                    continue
                out_tok[i] = tgt[pi][r]
                path_p[i] = path_p[tree.parents[i]] * vals[pi][r]
                ok[i] = path_p[i] >= self.draft_threshold and vals[pi][r] > 0
            grow = [i for i in level if ok[i] and path_p[i] >= bar and tree.children[i]]
            if not grow or d == tree.max_depth:
                continue
            m, ntree = len(grow), len(col)
            ids_in = torch.tensor([out_tok[i] for i in grow], device=dev)[None]
            hid_in = torch.cat([outs[tree.parents[i]] for i in grow])[None]  # [1, m, H]
            pos = torch.full((1, m), n - 2 + d, device=dev)
            attn = torch.cat([torch.ones(m, plen, dtype=torch.bool), level_mask(tree, grow, col)], 1).to(dev)
            out, past, level_logits = self._pass(ids_in, hid_in, pos, attn, past, keep=0)
            for j, i in enumerate(grow):
                outs[i], logit_of[i], col[i] = out[:, j], level_logits[:, j], ntree + j
        return torch.tensor(out_tok, dtype=torch.long), torch.tensor(ok, dtype=torch.bool)

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row, an EAGLE-2 dynamic tree (Li et al. 2024; :class:`decode.dynamic_tree.TreeBuilder`): the
        head's ``spec.topk`` best children of the ``spec.topk`` best nodes of each level, by cumulative
        log-probability, one head pass per level under tree attention as in :meth:`propose_tree`; the best
        ``spec.total`` nodes are verified. ``draft_threshold`` / ``expand_threshold`` bar nodes and their
        expansion as in static trees. Deterministic: ``probs=None``.

        Returns:
            :func:`decode.dynamic_tree.pack_rows`: ``tokens``, ``mask``, ``scores [B, N]`` and ``trees``.

        Raises:
            ValueError: the decoder passed no features.
        """
        if state.features is None:
            raise ValueError(f"{self.kind} needs target features; the decoder must honour feature_layers")
        if not hasattr(self, "_caches") or len(self._caches) != len(state.tokens):
            self.reset(len(state.tokens))
        rows = []
        with torch.no_grad():
            for b, toks in enumerate(state.tokens):
                ready = state.active[b] and len(toks) >= 2
                rows.append(self._dynamic_row(b, toks, state.features[b], state.num_stable[b], spec,
                                              state.vocab_size) if ready else None)
        return pack_rows(rows)

    def _dynamic_row(self, b, toks, feats, stable, spec, vocab_size) -> RowTree:
        n = len(toks)
        root, root_logits = self._catch_up(b, toks, feats, stable)  # [1, H], [1, V']: predicts tokens[n]
        past = self._caches[b]["kv"]
        plen = kv_len(past)
        builder = TreeBuilder(spec, self.draft_threshold, self.expand_bar)
        outs: dict[int, torch.Tensor] = {-1: root}  # head output per expanded node
        logit_of: dict[int, torch.Tensor] = {-1: root_logits}  # and its draft logits [1, V']
        ids = self.draft_id_map()
        col: dict[int, int] = {}  # expanded node -> its column among the tree's head-cache entries
        frontier = [-1]
        while frontier:
            logits = torch.cat([logit_of[p] for p in frontier])  # [P, V']
            if ids is not None:
                logits = mask_unproposable(logits, ids, vocab_size)
            else:
                logits = logits[:, :vocab_size]
            frontier = builder.add_children(torch.log_softmax(logits.float(), -1), ids)
            if not frontier:
                break
            m, ntree = len(frontier), len(col)
            ids_in = torch.tensor([builder.tokens[i] for i in frontier], device=root.device)[None]
            hid_in = torch.cat([outs[builder.parents[i]] for i in frontier])[None]  # [1, m, H]
            pos = torch.full((1, m), n - 2 + builder.level, device=root.device)
            attn = torch.cat([torch.ones(m, plen, dtype=torch.bool), level_mask(builder.parents, frontier, col)], 1)
            out, past, level_logits = self._pass(ids_in, hid_in, pos, attn.to(root.device), past, keep=0)
            for j, i in enumerate(frontier):
                outs[i], logit_of[i], col[i] = out[:, j], level_logits[:, j], ntree + j
        return builder.result()

    @staticmethod
    def _to_target_probs(p: torch.Tensor, ids: torch.Tensor | None, v: int) -> torch.Tensor:
        if ids is None:
            return p.float()
        return torch.zeros(v, device=p.device).scatter_(0, ids, p.float())


def kv_len(past) -> int:
    """Positions held by a per-layer KV cache (``None``: 0)."""
    return 0 if past is None else past[0][0].shape[2]


def trim_kv(past, n: int):
    """A per-layer KV cache cut to its first ``n`` positions."""
    return tuple((k[:, :, :n], v[:, :, :n]) for k, v in past)


def target_shape_fields(target: nn.Module) -> dict:
    """The target's sizes a feature-level head copies (vocab, hidden, heads, head_dim, MLP, norm, RoPE), read from
    the decoder layer the head starts from (``drafters.target.layers.source_layer_ids``: the last one whose attention
    maps; a hybrid target's last full-attention layer) through that layer's config (Gemma-4's full-attention layers
    have their own ``head_dim``), and the MLP width of its dense MLP where it has one (LFM2's is not its config's
    ``intermediate_size``)."""
    c = target.config
    ids = source_layer_ids(target)
    lc = layer_config(c, ids[-1] if ids else c.num_hidden_layers - 1)
    mlp = llama_layer_tensors(decoder_layers(target)[ids[-1]], lc).get("mlp.up_proj.weight") if ids else None
    layer_types = getattr(c, "layer_types", None)
    return {"vocab_size": target.get_output_embeddings().weight.shape[0], "hidden_size": c.hidden_size,
            "target_num_layers": c.num_hidden_layers, "num_attention_heads": lc.num_attention_heads,
            "num_key_value_heads": getattr(lc, "num_key_value_heads", None) or lc.num_attention_heads,
            "head_dim": getattr(lc, "head_dim", None) or c.hidden_size // lc.num_attention_heads,
            "intermediate_size": mlp.shape[0] if mlp is not None else c.intermediate_size,
            "rms_norm_eps": next((v for v in (getattr(c, n, None) for n in _EPS_NAMES) if v), 1e-6),
            "rope_theta": rope_theta_of(c, layer_types[ids[-1]] if ids and layer_types else None)}


#: the config fields of a target's norm epsilon, by family (Nemotron-H: layer_norm_epsilon; LFM2: norm_eps)
_EPS_NAMES = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")


def borrow(target: nn.Module | None, config, kind: str) -> tuple[nn.Module, nn.Module]:
    """The target's (input embedding, LM head), checked against ``config``. Raises ``ValueError``."""
    if target is None:
        raise ValueError(f"{kind} drafter borrows the target's embedding and LM head: pass target=... "
                         "(from_pretrained(path, target=target))")
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    if tuple(head.weight.shape) != (config.vocab_size, config.hidden_size) or emb.weight.shape[1] != config.hidden_size:
        raise ValueError(f"{kind} config expects vocab {config.vocab_size} x hidden {config.hidden_size} but the "
                         f"target's LM head is {list(head.weight.shape)}; train the head for this target")
    return emb, head


def init_layer_from_target(layer: DraftDecoderLayer, target: nn.Module) -> list[str]:
    """Copy the target's last decoder layer whose attention maps (the last layer of an attention-only target, the
    last full-attention layer of a hybrid one; ``drafters.target.layers.source_layer_ids``) into ``layer`` where it
    maps (EAGLE-1 practice), any family: fused projections split, norms by their effective scale, post-norms and MoE
    MLPs left at their default init (``drafters.target.layers``). Returns the parameter names copied: none where no
    layer maps (DeepSeek's latent attention), the layer then keeping its fresh init (training prints
    ``drafters.target.layers.fresh_init_note``)."""
    ids = source_layer_ids(target)
    if not ids:
        return []
    src = decoder_layers(target)[ids[-1]]
    return copy_matching(layer, llama_layer_tensors(src, layer_config(target.config, ids[-1])))
