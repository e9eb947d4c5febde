"""Independent draft LM (Leviathan et al. 2023; Chen et al. 2023): a small causal LM over the
target's vocabulary proposes K tokens autoregressively; the target verifies them in one pass.

Three ways to get one: ``init="scratch"`` (a small random Llama from :class:`DraftLMConfig`),
``DraftLM.from_target(target, num_layers)`` (``"truncated_target"``: the target's embeddings, first
N decoder layers, final norm and LM head, as in "layer-skip" style self-drafting baselines), and
``DraftLM.from_model(hf_model)`` (``"checkpoint"``: any transformers causal LM sharing the target's
tokenizer, e.g. SmolLM2-135M drafting for SmolLM2-1.7B).

Also home of :class:`RaggedCache`, the batched KV-cache bookkeeping shared with ``decode.engine``:
rows of different lengths live in one transformers ``DynamicCache``; left padding and rejected or
stale entries are masked out through a 2-D attention mask and each row gets explicit positions
(gpt-fast style: a rejection only masks / crops, it never re-allocates per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from decode.attention import verification_attention
from decode.protocol import DecodeState, Proposal, SamplingParams
from decode.sampling import select_tokens
from decode.tree import level_mask
from drafters.base import ChainCutoff, Drafter


class RaggedCache:
    """A KV cache for a batch of rows of different lengths, for one transformers causal LM.

    Cache column ``j`` of row ``b`` is valid iff ``mask[b, j] == 1``. ``n_real[b]`` counts the valid
    columns (= the row's tokens processed so far = the RoPE position of its next token). All rows
    share the cache length ``length``.
    """

    def __init__(self, model: nn.Module, batch_size: int, device: torch.device, capacity: int = 256):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(batch_size, max(capacity, 1), dtype=torch.long, device=device)
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0
        self._pending = 0

    def _reserve(self, extra: int) -> None:
        need = self.length + extra
        if need > self.mask.shape[1]:  # geometric growth: amortised O(1), not per token
            grown = torch.zeros(self.mask.shape[0], max(need, 2 * self.mask.shape[1]), dtype=self.mask.dtype,
                                device=self.mask.device)
            grown[:, : self.length] = self.mask[:, : self.length]
            self.mask = grown

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None, **kw: Any):
        m = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = self.mask[:, : self.length + m]
        with verification_attention(self.model):  # multi-token passes without copying GQA key/values
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, cache=self.cache, use_cache=True, **kw)
        self.cache = out.cache if getattr(out, "cache", None) is not None else self.cache
        return out

    def prefill(self, rows: list[list[int]], **kw: Any):
        """Left-pad ``rows`` into ``[B, P]`` and run them; every real token becomes valid.

        Returns the model output (``logits_to_keep=1`` -> logits ``[B, 1, V]`` at each row's last token).
        """
        b, p = len(rows), max(len(r) for r in rows)
        dev = self.mask.device
        ids = torch.zeros(b, p, dtype=torch.long, device=dev)
        self.length, self._pending = 0, 0
        self._reserve(p)
        self.mask[:, :p] = 0
        for i, r in enumerate(rows):
            ids[i, p - len(r):] = torch.tensor(r, dtype=torch.long)
            self.mask[i, p - len(r): p] = 1
        pos = (self.mask[:, :p].cumsum(-1) - 1).clamp(min=0)
        out = self._forward(ids, pos, **kw)
        self.length = p
        self.n_real = torch.tensor([len(r) for r in rows], dtype=torch.long, device=dev)
        return out

    def run(self, input_ids: torch.Tensor, **kw: Any):
        """Append ``input_ids [B, m]`` at each row's next positions; call :meth:`keep` afterwards."""
        m = input_ids.shape[1]
        self._reserve(m)
        self.mask[:, self.length: self.length + m] = 1
        pos = self.n_real[:, None] + torch.arange(m, device=self.mask.device)
        out = self._forward(input_ids, pos, **kw)
        self._pending = m
        return out

    def run_tree(self, input_ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, **kw: Any):
        """Append tree nodes ``input_ids [B, m]`` after each row's valid columns (and after the nodes of
        earlier ``run_tree`` calls since the last :meth:`keep` / :meth:`truncate`, ``P`` columns).

        ``depths [m]``: each column's offset from the next position (RoPE position = ``n_real + depth``);
        ``tree_mask [m, P + m]`` bool: which of the pending and new columns each new column may attend to
        (its ancestors and itself). Passed to the model as a 4-D additive mask ``[B, 1, m, length + P + m]``
        (transformers uses a 4-D mask as given). Afterwards: :meth:`reorder` + :meth:`keep` (the decoder's
        verification pass) or :meth:`truncate` to drop the nodes (a drafter's tree).

        Raises:
            ValueError: ``tree_mask`` is not ``[m, P + m]``.
        """
        b, m = input_ids.shape
        p = self._pending
        if tuple(tree_mask.shape) != (m, p + m):
            raise ValueError(f"tree_mask must be [m, P + m] = [{m}, {p + m}], got {tuple(tree_mask.shape)}")
        self._reserve(p + m)
        self.mask[:, self.length + p: self.length + p + m] = 1
        dev = self.mask.device
        pos = self.n_real[:, None] + depths.to(dev)[None]
        seen = torch.cat([self.mask[:, None, : self.length].bool().expand(b, m, self.length),
                          tree_mask.to(dev)[None].expand(b, m, p + m)], -1)[:, None]  # [B, 1, m, L+P+m]
        dtype = next(self.model.parameters()).dtype
        if not dtype.is_floating_point:
            dtype = torch.float32
        additive = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill_(~seen, torch.finfo(dtype).min)
        out = self._forward(input_ids, pos, attention_mask=additive, **kw)
        self._pending = p + m
        return out

    def reorder(self, index: torch.Tensor) -> None:
        """After :meth:`run_tree`: new column ``j`` of row ``b`` takes the keys/values of new column
        ``index[b, j]`` (``index [B, n] <= m``), so an accepted tree path becomes contiguous.

        Raises:
            NotImplementedError: the model's cache has no per-layer ``keys``/``values`` tensors.
        """
        start, n = self.length, index.shape[1]
        layers = getattr(self.cache, "layers", None)
        if layers is None or not all(hasattr(layer, "keys") for layer in layers):
            raise NotImplementedError(f"tree drafts need a cache with per-layer keys/values tensors; "
                                      f"{type(self.cache).__name__} has none")
        rows = index.tolist()
        # columns every row already has in place are not copied (a path's first node is often column 1)
        first = next((j for j in range(n) if any(r[j] != j for r in rows)), n)
        if first == n:
            return
        src = [torch.tensor(r[first:], dtype=torch.long) + start for r in rows]
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)  # [B, H, S, D]
                for b, s in enumerate(src):  # per row: one index_select, not a gather over an expanded index
                    t[b, :, start + first: start + n] = t[b].index_select(1, s.to(t.device))

    def keep(self, valid: torch.Tensor, valid_max: int | None = None) -> None:
        """After :meth:`run`: keep the first ``valid[b]`` new columns of each row, mask the rest and
        crop the cache to the longest row. ``valid_max`` (= ``int(valid.max())``) saves a host sync."""
        m, start = self._pending, self.length
        vmax = int(valid.max()) if valid_max is None else valid_max
        cols = torch.arange(m, device=valid.device)
        self.mask[:, start: start + m] = (cols[None, :] < valid[:, None]).long()
        self.truncate(start + vmax)
        self.n_real = self.n_real + valid
        self._pending = 0

    def truncate(self, length: int, n_real: torch.Tensor | None = None) -> None:
        """Drop cache columns ``>= length`` (optionally resetting ``n_real``)."""
        current = self.cache.get_seq_length()
        if current > length:
            self.cache.crop(length - current)
        self.length = length
        self._pending = 0
        if n_real is not None:
            self.n_real = n_real.clone()


@dataclass
class DraftLMConfig:
    """A small Llama draft model. ``hf_config`` (a transformers config dict, any architecture) overrides
    the Llama fields when set (``from_target`` / ``from_model`` store the source's config there).
    ``init``: ``"scratch" | "truncated_target" | "checkpoint"`` (how the weights were first made)."""

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 2
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    init: str = "scratch"
    hf_config: dict | None = None

    def __post_init__(self):
        if self.init not in ("scratch", "truncated_target", "checkpoint"):
            raise ValueError(f"DraftLMConfig.init must be 'scratch', 'truncated_target' or 'checkpoint', "
                             f"got {self.init!r}")
        if self.num_layers < 1:
            raise ValueError(f"DraftLMConfig.num_layers must be >= 1, got {self.num_layers}")

    def to_hf_config(self):
        """The transformers config the draft model is built from."""
        from transformers import AutoConfig, LlamaConfig

        if self.hf_config is not None:
            cfg = dict(self.hf_config)
            return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id)


def _hf_config_dict(model: nn.Module, **overrides: Any) -> dict:
    cfg = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "architectures", "dtype",
                "torch_dtype"):
        cfg.pop(key, None)
    cfg.update(overrides)
    return cfg


def _llama_fields(model: nn.Module) -> dict:
    """The :class:`DraftLMConfig` Llama fields a transformers config has (for a readable config.json)."""
    c, out = model.config, {}
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                 "eos_token_id", "pad_token_id"):
        if getattr(c, name, None) is not None:
            out[name] = getattr(c, name)
    return out


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


class DraftLM(Drafter):
    """A transformers causal LM used as an independent drafter.

    ``forward(input_ids [B, T], attention_mask [B, T] | None) -> logits [B, T, V]`` (plain causal LM,
    for training). ``propose`` keeps its own :class:`RaggedCache`, re-synchronised from
    ``state.num_stable`` each round: catch up on the newly committed tokens (incl. the bonus
    token) in one forward, then K autoregressive steps, sampling from q when not greedy.
    """

    supports_draft_threshold = True

    kind = "draft_lm"
    config_class = DraftLMConfig

    def __init__(self, config: DraftLMConfig, target: nn.Module | None = None, model: nn.Module | None = None):
        super().__init__(config)
        from transformers import AutoModelForCausalLM

        self.lm = model if model is not None else AutoModelForCausalLM.from_config(config.to_hf_config())
        self._cache: RaggedCache | None = None
        self._synced: list[int] = []

    # --- construction ------------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target: nn.Module, num_layers: int) -> DraftLM:
        """Truncated target: embeddings, first ``num_layers`` decoder layers, final norm, LM head (copied).

        Raises:
            ValueError: ``num_layers`` not in ``[1, target layers]``.
        """
        total = target.config.num_hidden_layers
        if not 1 <= num_layers <= total:
            raise ValueError(f"num_layers must be in [1, {total}] for this target, got {num_layers}")
        hf = _hf_config_dict(target, num_hidden_layers=num_layers)
        for key in ("layer_types",):
            if isinstance(hf.get(key), list):
                hf[key] = hf[key][:num_layers]
        cfg = DraftLMConfig(**_llama_fields(target), num_layers=num_layers, init="truncated_target",
                            hf_config=hf, vocab_size=lm_head_rows(target))
        drafter = cls(cfg)
        src = target.state_dict()
        own = drafter.lm.state_dict()
        missing = [k for k in own if k not in src]
        if missing:
            raise ValueError(f"target has no tensors for {missing[:4]}; truncation needs a decoder-only LM")
        drafter.lm.load_state_dict({k: src[k].detach().clone() for k in own}, strict=True)
        param = next(target.parameters())
        return drafter.to(device=param.device, dtype=param.dtype).eval()

    @classmethod
    def from_model(cls, model: nn.Module) -> DraftLM:
        """Wrap any transformers causal LM (weights shared, not copied) as a drafter."""
        layers = getattr(model.config, "num_hidden_layers", None) or 1
        cfg = DraftLMConfig(**_llama_fields(model), num_layers=layers, init="checkpoint",
                            hf_config=_hf_config_dict(model), vocab_size=lm_head_rows(model))
        return cls(cfg, model=model)

    # --- training ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal-LM logits ``[B, T, V]`` for ``input_ids [B, T]``."""
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    # --- decoder protocol ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Rows of the draft LM head."""
        return lm_head_rows(self.lm)

    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        check_vocab_match(target, self.lm, what=f"{self.kind} drafter")

    def vocab_limit(self, target: nn.Module) -> int:
        """The vocabulary shared with ``target`` (ids this draft model may propose). Raises ``ValueError``
        when the two do not share a tokenizer (see :func:`check_vocab_match`)."""
        return check_vocab_match(target, self.lm, what="draft model")

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
                generator: torch.Generator | None) -> Proposal:
        """``k`` draft tokens per row (``[B, k]``) and, when sampling, their q (``[B, k, V]``)."""
        logits = self._catch_up(state)
        c = self._cache
        self._snapshot_len, self._snapshot_n = c.length, c.n_real.clone()
        tokens, probs = [], []
        cut = ChainCutoff(self.draft_threshold, len(state.tokens), k)
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
                     generator: torch.Generator | None) -> Proposal:
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
        bar = self.expand_bar  # nodes below it stay leaves
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
                    ok[:, i] = above_ok & (path_p[:, i] >= self.draft_threshold) & (top.values[:, r] > 0)
            grow = [i for i in level if tree.children[i] and bool((ok[:, i] & (path_p[:, i] >= bar)).any())]
            if not grow or depth == tree.max_depth:
                continue
            ntree, m = len(col), len(grow)
            out = c.run_tree(tokens[:, grow], torch.full((m,), depth - 1), level_mask(tree, grow, col))
            for j, i in enumerate(grow):
                outs[i], col[i] = out.logits[:, j], ntree + j
        c.truncate(self._snapshot_len, self._snapshot_n)
        return Proposal(tokens=tokens.cpu(), probs=None, mask=ok.cpu())
