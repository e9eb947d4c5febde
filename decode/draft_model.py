"""An independent draft model (Leviathan et al. 2023; Chen et al. 2023): any transformers causal LM
over the target's vocabulary proposes K tokens autoregressively, or a token tree level by level, from
its own :class:`decode.cache.RaggedCache`; the target verifies them in one pass.

``decode.generate(..., drafter=hf_model)`` wraps a plain transformers causal LM in :class:`DraftModel`;
``drafters.draft_lm.DraftLM`` (the trainable kind, with configs, truncation and save / load) drafts
through one as well.
"""

from __future__ import annotations

import torch
from torch import nn

from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.cutoff import ChainCutoff
from drafterkit.decode.dynamic_tree import DynamicTree, TreeBuilder, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.decode.sampling import select_tokens
from drafterkit.decode.tree import level_mask


def lm_head_rows(model: nn.Module) -> int:
    """Rows of a causal LM's output embedding (its vocabulary incl. padding rows)."""
    return model.get_output_embeddings().weight.shape[0]


def check_vocab_match(target: nn.Module, draft: nn.Module, what: str = "draft model") -> int:
    """Check a draft LM can serve ``target``; return the shared real vocabulary size.

    Sizes may differ only by LM-head padding rows (at most ``min(128, smaller // 8)`` rows); the
    special token ids (bos / eos / pad) in both configs, where both set them, must be equal.

    Raises:
        ValueError: naming both vocabulary sizes, or the differing special token ids.
    """
    tv, dv = lm_head_rows(target), lm_head_rows(draft)
    small = min(tv, dv)
    if abs(tv - dv) > min(128, small // 8):
        raise ValueError(f"{what} has a vocabulary of {dv} tokens but the target has {tv}: they do not share a "
                         "tokenizer (sizes may differ only by LM-head padding rows). Use a draft model trained "
                         "with the target's tokenizer")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(target.config, key, None), getattr(draft.config, key, None)
        if a is not None and b is not None and a != b:
            raise ValueError(f"{what} has {key}={b} but the target has {key}={a}: different tokenizers. Use a "
                             "draft model that shares the target's tokenizer")
    return min(small, getattr(target.config, "vocab_size", small) or small,
               getattr(draft.config, "vocab_size", small) or small)


class DraftModel:
    """A transformers causal LM ``lm`` as a proposer (``decode.protocol.TreeProposer``).

    Keeps its own :class:`RaggedCache`, re-synchronised from ``state.num_stable`` each round: catch up
    on the newly committed tokens (incl. the bonus token) in one forward, then K autoregressive steps,
    sampling from q when not greedy. ``draft_threshold`` / ``expand_threshold`` are the confidence
    bars of ``drafters.base.Drafter`` (0.0: always ``k`` tokens / the full tree).

    Raises (at ``check_compatible`` / ``vocab_limit``):
        ValueError: the draft model and the target do not share a tokenizer (:func:`check_vocab_match`).
    """

    feature_layers = None

    def __init__(self, lm: nn.Module, what: str = "draft model"):
        self.lm, self.what = lm, what
        self._cache: RaggedCache | None = None
        self._synced: list[int] = []

    @property
    def vocab_size(self) -> int:
        """Rows of the draft LM head."""
        return lm_head_rows(self.lm)

    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        check_vocab_match(target, self.lm, what=self.what)

    def vocab_limit(self, target: nn.Module) -> int:
        """The vocabulary shared with ``target`` (ids this draft model may propose). Raises ``ValueError``
        when the two do not share a tokenizer (see :func:`check_vocab_match`)."""
        return check_vocab_match(target, self.lm, what=self.what)

    def reset(self, batch_size: int) -> None:
        self._cache, self._synced = None, []

    def _catch_up(self, state: DecodeState) -> torch.Tensor:
        """Feed every committed token not yet in the draft cache; return logits ``[B, V]`` after each
        row's last token."""
        dev = next(self.lm.parameters()).device
        lens = [len(t) for t in state.tokens]
        stale = (self._cache is None or len(self._synced) != len(lens)
                 or any(s > n for s, n in zip(self._synced, state.num_stable)))
        if stale:
            self._cache = RaggedCache(self.lm, len(lens), dev, capacity=max(lens) + 64)
            out = self._cache.prefill(state.tokens, logits_to_keep=1)
            self._synced = lens
            return out.logits[:, -1]
        c = self._cache
        c.truncate(self._snapshot_len, self._snapshot_n)  # drop last round's draft columns
        new = [t[s:] for t, s in zip(state.tokens, self._synced)]
        m = max(max(len(x) for x in new), 1)
        ids = torch.zeros(len(new), m, dtype=torch.long, device=dev)
        for i, x in enumerate(new):
            if x:
                ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        valid = torch.tensor([len(x) for x in new], dtype=torch.long, device=dev)
        out = c.run(ids)
        c.keep(valid, valid_max=max(len(x) for x in new))
        self._synced = lens
        idx = (valid - 1).clamp(min=0)
        return out.logits[torch.arange(len(new), device=dev), idx]

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None, *, draft_threshold: float = 0.0) -> Proposal:
        """``k`` draft tokens per row (``[B, k]``) and, when sampling, their q (``[B, k, V]``)."""
        logits = self._catch_up(state)
        c = self._cache
        self._snapshot_len, self._snapshot_n = c.length, c.n_real.clone()
        c.mark()  # a draft model with recurrent layers gets their states back at the next round's truncate
        tokens, probs = [], []
        cut = ChainCutoff(draft_threshold, len(state.tokens), k)
        for i in range(k):
            tok, q = select_tokens(logits, sampling, state.vocab_size, generator)
            cut.update(i, tok, logits=logits, probs=q, vocab_size=state.vocab_size)
            tokens.append(tok)
            probs.append(q)
            if cut.done:  # every row's chain has ended: pad with the last token, draft no further
                tokens += [tok] * (k - i - 1)
                probs += [q] * (k - i - 1)
                break
            if i + 1 < k:
                out = c.run(tok[:, None])
                c.keep(torch.ones_like(tok), valid_max=1)
                logits = out.logits[:, -1]
        draft = torch.stack(tokens, 1) if tokens else torch.zeros(len(state.tokens), 0, dtype=torch.long)
        q = None if sampling.greedy or not probs else torch.stack(probs, 1)
        return Proposal(tokens=draft, probs=q, lengths=cut.lengths)

    @torch.no_grad()
    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None, *, draft_threshold: float = 0.0,
                     expand_threshold: float = 0.0) -> Proposal:
        """One token per node of ``tree`` (a ``decode.tree.DraftTree``) per row: the draft model's rank-r
        token after the node's ancestors (SpecInfer-style token tree from a small LM, Miao et al. 2024),
        drafted level by level: one draft-model forward per depth over that depth's nodes under tree
        attention in the draft model's own cache, which is cut back to the committed tokens afterwards.
        ``draft_threshold > 0`` masks nodes whose path probability falls below it (with their subtrees);
        nodes below ``expand_threshold`` are proposed as leaves. Deterministic (top-k): ``probs=None``.

        Returns:
            ``Proposal(tokens [B, N], mask [B, N])``.
        """
        logits = self._catch_up(state)  # [B, V]: the distribution of the depth-1 tokens
        c = self._cache
        self._snapshot_len, self._snapshot_n = c.length, c.n_real.clone()
        b_all, n_nodes, dev = len(state.tokens), tree.num_nodes, logits.device
        tokens = torch.zeros(b_all, n_nodes, dtype=torch.long, device=dev)
        ok = torch.zeros(b_all, n_nodes, dtype=torch.bool, device=dev)
        path_p = torch.ones(b_all, n_nodes, device=dev)
        active = torch.tensor(state.active, device=dev)
        bar = max(draft_threshold, expand_threshold)  # nodes below it stay leaves
        outs, col = {-1: logits}, {}
        for depth, level in enumerate(tree.levels(), 1):
            for par in sorted({tree.parents[i] for i in level}):
                if par not in outs:
                    continue
                kids = [i for i in level if tree.parents[i] == par]
                probs = torch.softmax(outs[par][:, : state.vocab_size].float(), -1)
                top = probs.topk(min(max(tree.ranks[i] for i in kids) + 1, probs.shape[-1]), -1)
                above_p = path_p[:, par] if par >= 0 else torch.ones(b_all, device=dev)
                above_ok = ok[:, par] & (above_p >= bar) if par >= 0 else active
                for i in kids:
                    r = tree.ranks[i]
                    if r >= top.indices.shape[-1]:
                        continue
                    tokens[:, i] = top.indices[:, r]
                    path_p[:, i] = above_p * top.values[:, r]
                    ok[:, i] = above_ok & (path_p[:, i] >= draft_threshold) & (top.values[:, r] > 0)
            grow = [i for i in level if tree.children[i] and bool((ok[:, i] & (path_p[:, i] >= bar)).any())]
            if not grow or depth == tree.max_depth:
                continue
            ntree, m = len(col), len(grow)
            out = c.run_tree(tokens[:, grow], torch.full((m,), depth - 1), level_mask(tree, grow, col))
            for j, i in enumerate(grow):
                outs[i], col[i] = out.logits[:, j], ntree + j
        c.truncate(self._snapshot_len, self._snapshot_n)
        return Proposal(tokens=tokens.cpu(), probs=None, mask=ok.cpu())

    @torch.no_grad()
    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None, *, draft_threshold: float = 0.0,
                             expand_threshold: float = 0.0) -> Proposal:
        """Per row, an EAGLE-2 dynamic tree (Li et al. 2024; :class:`decode.dynamic_tree.TreeBuilder`) from
        the draft model: the ``spec.topk`` best children of the ``spec.topk`` best nodes of each level by
        cumulative log-probability, one draft-model forward per level over every row's frontier under a
        per-row tree mask in its own cache (cut back to the committed tokens afterwards); the best
        ``spec.total`` nodes per row are verified. Thresholds as in :meth:`propose_tree`.
        Deterministic: ``probs=None``.

        Returns:
            :func:`decode.dynamic_tree.pack_rows`: ``tokens``, ``mask``, ``scores [B, N]`` and ``trees``.
        """
        logits = self._catch_up(state)  # [B, V]: the distribution of the depth-1 tokens
        c = self._cache
        self._snapshot_len, self._snapshot_n = c.length, c.n_real.clone()
        b_all, dev = len(state.tokens), logits.device
        bar = max(draft_threshold, expand_threshold)
        builders = [TreeBuilder(spec, draft_threshold, bar) if a else None for a in state.active]
        lp = torch.log_softmax(logits[:, : state.vocab_size].float(), -1)
        fronts = [bl.add_children(lp[b][None]) if bl else [] for b, bl in enumerate(builders)]
        cols: list[dict[int, int]] = [{} for _ in range(b_all)]  # per row: node -> its column in the cache
        width = 0  # tree columns already in the cache (rows padded alike)
        while any(fronts):
            m = max(len(f) for f in fronts)
            tokens = torch.zeros(b_all, m, dtype=torch.long)
            mask = torch.zeros(b_all, m, width + m, dtype=torch.bool)
            for b, f in enumerate(fronts):
                mask[b, :, width:] = torch.eye(m, dtype=torch.bool)  # padding columns see themselves
                if f:
                    tokens[b, : len(f)] = torch.tensor([builders[b].tokens[i] for i in f])
                    mask[b, : len(f), : width + len(f)] = level_mask(builders[b].parents, f, cols[b], width)
                    mask[b, : len(f), width + len(f):] = False
            level = max(bl.level for bl in builders if bl)
            out = c.run_tree(tokens.to(dev), torch.full((m,), level - 1), mask)
            lp = torch.log_softmax(out.logits[:, :, : state.vocab_size].float(), -1)  # [B, m, V]
            for b, f in enumerate(fronts):
                for j, i in enumerate(f):
                    cols[b][i] = width + j
                fronts[b] = builders[b].add_children(lp[b, : len(f)]) if f else []
            width += m
        c.truncate(self._snapshot_len, self._snapshot_n)
        return pack_rows([bl.result() if bl else None for bl in builders])
