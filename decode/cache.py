"""The decoder's KV cache for a batch of ragged rows: :class:`RaggedCache`.

Rows of different lengths live in one transformers ``DynamicCache``; left padding and rejected or
stale entries are masked out through a 2-D attention mask and each row gets explicit RoPE positions
(gpt-fast style: a rejection only masks / crops, it never re-allocates per token). The engine keeps
one for the target; an independent draft model (:mod:`decode.draft_model`) keeps one of its own.

**Sliding-window attention** (Mistral with ``sliding_window`` set, Gemma-2, Gemma-3, gpt-oss: the layers that
transformers' ``get_layer_types_and_kwargs`` names ``"sliding_attention"``). transformers' own sliding cache
layers keep only the last ``window - 1`` keys, so once a sequence passes the window a rejected draft token can no
longer be cropped. Every layer here keeps a full (growing) cache instead, and the window is applied in the
attention mask, by absolute position rather than by cache column (rows of a ragged batch hold left padding and
masked rejected columns): a query at position ``p`` of a sliding layer sees the valid keys at positions
``p - window < q <= p``, transformers' convention (``masking_utils.sliding_window_overlay``) for every family.
Each pass then gets an explicit 4-D mask per layer type, so :func:`decode.attention.exact_sdpa` (or the model's
eager attention: Gemma-2 and gpt-oss have no SDPA path) computes each query over exactly its window's keys.
Memory: a sliding layer's cache grows with the sequence, as a full-attention layer's does (for gpt-oss, half of
its layers keep ``L`` keys instead of 128): the price of rolling back rejected draft tokens exactly.

**Recurrent layers** (hybrid targets: Mamba-2, Gated DeltaNet, short convolutions) have no columns to mask or
crop: :class:`decode.recurrent_cache.RecurrentStates` records their state at every position of a pass and
:meth:`RaggedCache.keep` selects, per row, the state after its kept tokens (vLLM's per-position states); a caller
that drops tokens later (a draft model's draft steps) takes :meth:`RaggedCache.mark` first. Tree passes over them
are refused. A model recurrent throughout (Mamba, Falcon-Mamba, Mamba-2) gets a 2-D mask of the new tokens only:
it has no keys to mask, and Mamba and Falcon-Mamba multiply their inputs by the mask as given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer, get_layer_types_and_kwargs

from drafterkit.decode import compact, compiled
from drafterkit.decode.compact import CACHE_ARG
from drafterkit.decode.attention import verification_attention
from drafterkit.decode.recurrent import RECURRENT_LAYER_TYPES
from drafterkit.decode.recurrent_cache import RecurrentStates



class RaggedCache:
    """A KV cache for a batch of rows of different lengths, for one transformers causal LM.

    Cache column ``j`` of row ``b`` is valid iff ``mask[b, j] == 1``. ``n_real[b]`` counts the valid
    columns (= the row's tokens processed so far = the RoPE position of its next token). All rows
    share the cache length ``length``. ``exact``: every pass runs :func:`decode.attention.exact_sdpa`, so
    each query's attention is computed as a plain decoding step computes it (the engine's target cache).
    ``rollback`` (models with recurrent layers): record their per-position states so that :meth:`keep` leaves
    each row the state after its kept tokens; False (plain decoding: every active row keeps its one token)
    skips the recording, and a row keeping fewer tokens than a pass fed (a finished row) then holds a state
    past them. ``compiled``: the passes after the prefill run compiled (``decode.compiled``; the engine's target
    cache while ``decode.compiled_mode`` is on, outside exact mode).
    """

    def __init__(self, model: nn.Module, batch_size: int, device: torch.device, capacity: int = 256,
                 exact: bool = False, rollback: bool = True, compiled: bool = False):
        self.model, self.exact, self.rollback, self.compiled = model, exact, rollback, compiled
        self.cache = DynamicCache(config=model.config)
        self.window, self.all_sliding = _sliding_layers(model.config)
        text = model.config.get_text_config(decoder=True)
        self._recurrent_types = {t for t in getattr(text, "layer_types", None) or [] if t in RECURRENT_LAYER_TYPES}
        for i, layer in enumerate(self.cache.layers):  # full layers: a sliding one cannot crop a full window
            if getattr(layer, "is_sliding", False):
                self.cache.layers[i] = DynamicLayer()
        self._scan_layers()
        # the target's forward as one function (decode.compact) where it computes this model (in exact mode too:
        # it attends through the same exact attention); recurrent or sliding layers take transformers' forward
        self.compact = (compact.ENABLED and self.window is None and not self._recurrent_types
                        and compact.compact_problem(model) is None)
        self._mark: tuple[int, torch.Tensor, list] | None = None
        self.mask = torch.zeros(batch_size, max(capacity, 1), dtype=torch.long, device=device)
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0
        self._pending = 0
        self._pending_pos = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # tree nodes' positions

    def _scan_layers(self) -> None:
        """Find the recurrent layers (:class:`RecurrentStates`, falsy for an attention-only model) and the first
        attention layer, whose length counts the cache columns (a hybrid's layer 0 may be recurrent or MLP-only)."""
        self.recurrent = RecurrentStates(self.cache)
        attention = [i for i, layer in enumerate(self.cache.layers) if isinstance(layer, CacheLayerMixin)]
        self._attn_layer, self._attention = (attention or [0])[0], bool(attention) or not self.recurrent

    def _reserve(self, extra: int) -> None:
        need = self.length + extra
        if need > self.mask.shape[1]:  # geometric growth: amortised O(1), not per token
            grown = torch.zeros(self.mask.shape[0], max(need, 2 * self.mask.shape[1]), dtype=self.mask.dtype,
                                device=self.mask.device)
            grown[:, : self.length] = self.mask[:, : self.length]
            self.mask = grown

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, seen: torch.Tensor | None = None,
                 **kw: Any):
        """Run the model on ``input_ids [B, m]`` at ``position_ids [B, m]``. ``seen [B, m, K]`` bool (K = cache
        columns + pending + m): which keys each query may see; None = the valid columns, causally over the new
        ones (a 2-D mask to transformers unless a layer slides)."""
        m = input_ids.shape[1]
        if seen is None and not self._attention:  # recurrent throughout (Mamba): the new tokens' padding only
            attention_mask = self.mask[:, self.length: self.length + m]
        elif seen is None and self.window is None:
            attention_mask = self.mask[:, : self.length + m]
        else:
            if seen is None:
                k = self.length + m
                cols = torch.arange(k, device=self.mask.device)
                causal = cols[None, :] <= (k - m) + torch.arange(m, device=self.mask.device)[:, None]  # [m, K]
                seen = self.mask[:, None, :k].bool() & causal[None]
            attention_mask = self._masks(seen, position_ids)
        if self.compact and set(kw) <= {"logits_to_keep", "output_hidden_states"}:
            args = (self.model, input_ids, attention_mask, position_ids, self.cache)
            if self.compiled and not self.exact and (out := compiled.compiled_forward(
                    *args, **kw, capacity=self.mask.shape[1])) is not None:
                return out
            return compact.compact_forward(*args, exact=self.exact, **kw)
        with verification_attention(self.model, self.exact):  # multi-token passes without copying GQA K/V
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=True, **{CACHE_ARG: self.cache}, **kw)
        returned = getattr(out, CACHE_ARG, None)
        self.cache = returned if returned is not None else self.cache
        return out

    def prefill(self, rows: list[list[int]], **kw: Any):
        """Left-pad ``rows`` into ``[B, P]`` and run them; every real token becomes valid.

        Returns the model output (``logits_to_keep=1`` -> logits ``[B, 1, V]`` at each row's last token).
        """
        b, p = len(rows), max(len(r) for r in rows)
        dev = self.mask.device
        ids = torch.zeros(b, p, dtype=torch.long, device=dev)
        self.length, self._pending = 0, 0
        self._pending_pos = self._pending_pos[:, :0]
        self._reserve(p)
        self.mask[:, :p] = 0
        for i, r in enumerate(rows):
            ids[i, p - len(r):] = torch.tensor(r, dtype=torch.long)
            self.mask[i, p - len(r): p] = 1
        pos = (self.mask[:, :p].cumsum(-1) - 1).clamp(min=0)
        out = self._forward(ids, pos, **kw)
        self.length = p
        self.n_real = torch.tensor([len(r) for r in rows], dtype=torch.long, device=dev)
        self._scan_layers()  # a cache that makes its layers on first use holds them now
        if self.recurrent:  # from here on every pass keeps its per-position states until keep selects
            if self.rollback:
                self.recurrent.record()
            self.recurrent.set_length(p)
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

        ``depths [m]`` or ``[B, m]`` (per row): each column's offset from the next position (RoPE position
        = ``n_real + depth``); ``tree_mask [m, P + m]`` or ``[B, m, P + m]`` (per row: rows drafting
        different trees, e.g. EAGLE-2 dynamic trees) bool: which of the pending and new columns each new
        column may attend to (its ancestors and itself). Passed to the model as a 4-D additive mask
        ``[B, 1, m, length + P + m]`` (transformers uses a 4-D mask as given). Afterwards: :meth:`reorder`
        + :meth:`keep` (the decoder's verification pass) or :meth:`truncate` to drop the nodes (a
        drafter's tree).

        Raises:
            ValueError: ``tree_mask`` is not ``[m, P + m]`` or ``[B, m, P + m]``.
        """
        b, m = input_ids.shape
        p = self._pending
        if self.recurrent:
            raise NotImplementedError(f"{type(self.model).__name__} has recurrent layers: a tree pass would need a "
                                      "state per node, which decode.cache.RaggedCache does not keep; use chain drafts")
        if tuple(tree_mask.shape[-2:]) != (m, p + m) or tree_mask.dim() not in (2, 3) or (
                tree_mask.dim() == 3 and tree_mask.shape[0] != b):
            raise ValueError(f"tree_mask must be [m, P + m] = [{m}, {p + m}] or [B, m, P + m], got "
                             f"{tuple(tree_mask.shape)}")
        self._reserve(p + m)
        self.mask[:, self.length + p: self.length + p + m] = 1
        dev = self.mask.device
        depths = depths.to(dev)
        pos = self.n_real[:, None] + (depths if depths.dim() == 2 else depths[None])
        tree_mask = tree_mask.to(dev) if tree_mask.dim() == 3 else tree_mask.to(dev)[None].expand(b, m, p + m)
        seen = torch.cat([self.mask[:, None, : self.length].bool().expand(b, m, self.length),
                          tree_mask], -1)  # [B, m, L+P+m]
        out = self._forward(input_ids, pos, seen=seen, **kw)
        self._pending = p + m
        self._pending_pos = torch.cat([self._pending_pos, pos.expand(b, m)], 1)
        return out

    def _additive(self, seen: torch.Tensor) -> torch.Tensor:
        """``seen [B, m, K]`` bool -> the model's 4-D additive mask ``[B, 1, m, K]`` (transformers uses it as given)."""
        dtype = next(self.model.parameters()).dtype
        if not dtype.is_floating_point:
            dtype = torch.float32
        return torch.zeros(seen[:, None].shape, dtype=dtype, device=seen.device).masked_fill_(
            ~seen[:, None], torch.finfo(dtype).min)

    def _masks(self, seen: torch.Tensor, position_ids: torch.Tensor):
        """The attention mask(s) for ``seen [B, m, K]``: one additive mask when no layer slides or every layer
        does (Mistral), else ``{"full_attention": ..., "sliding_attention": ...}`` (the per-layer-type mapping
        Gemma-2/3 and gpt-oss accept). A sliding layer's query at position ``p`` keeps the keys at positions
        ``> p - window`` (the module docstring)."""
        if self.window is None:
            return self._additive(seen)
        b, m, k = seen.shape
        committed = self.mask[:, : self.length].cumsum(-1) - 1  # a valid column's position (others are masked)
        key_pos = torch.cat([committed, self._pending_pos, position_ids.expand(b, m)], 1)[:, :k]  # [B, K]
        windowed = seen & (key_pos[:, None, :] > position_ids.expand(b, m)[:, :, None] - self.window)
        if self.all_sliding:
            return self._additive(windowed)
        masks = {"full_attention": self._additive(seen), "sliding_attention": self._additive(windowed)}
        # a recurrent layer type in the mapping (LFM3's "conv"): its new tokens' padding, as transformers'
        # create_recurrent_attention_mask gives it (None for one token)
        padding = self.mask[:, self.length: self.length + m] if m > 1 else None
        return {**{t: padding for t in self._recurrent_types}, **masks}

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
        if self.recurrent and self.rollback:
            self.recurrent.select(valid, m)
        self._crop(start + vmax)
        self.n_real = self.n_real + valid

    def mark(self) -> None:
        """Remember this point (length, ``n_real`` and, for recurrent layers, their states) for a later
        :meth:`truncate` back to it: the only length a cache with recurrent layers can be truncated to."""
        self._mark = (self.length, self.n_real.clone(), self.recurrent.snapshot() if self.recurrent else [])

    def cache_length(self) -> int:
        """Columns the attention layers hold (0 before the first pass)."""
        return int(self.cache.get_seq_length(self._attn_layer))

    def truncate(self, length: int, n_real: torch.Tensor | None = None) -> None:
        """Drop cache columns ``>= length`` (optionally resetting ``n_real``).

        Raises:
            RuntimeError: the model has recurrent layers and ``length`` is neither the current length (with no
                pending columns) nor the length at the last :meth:`mark`.
        """
        if self.recurrent and (length != self.length or self._pending):
            if self._mark is None or self._mark[0] != length:
                raise RuntimeError(f"{type(self.model).__name__} has recurrent layers, whose state cannot be cut "
                                   f"back to {length} columns without RaggedCache.mark() taken there")
            self.recurrent.restore(self._mark[2])
        self._crop(length)
        if n_real is not None:
            self.n_real = n_real.clone()

    def _crop(self, length: int) -> None:
        """Crop the attention layers to ``length`` columns (a recurrent layer keeps its state: :meth:`keep`
        selected it) and end the pending pass."""
        current = self.cache_length()
        if current > length:
            for layer in self.cache.layers:
                if not self.recurrent or all(layer is not r for r in self.recurrent.layers):
                    layer.crop(length - current)
                elif isinstance(layer, DynamicLayer):  # a hybrid layer's attention part, not its recurrent part
                    DynamicLayer.crop(layer, length - current)
        if self.recurrent:
            self.recurrent.set_length(length)
        self.length = length
        self._pending = 0
        self._pending_pos = self._pending_pos[:, :0]


def _sliding_layers(config) -> tuple[int | None, bool]:
    """``(window, every_layer_slides)`` of a causal LM's config: the sliding window in tokens of its
    ``"sliding_attention"`` layers (None: no layer slides) and whether every attention layer slides.

    Raises:
        NotImplementedError: the sliding layers have different windows (one mask serves every sliding layer).
    """
    text = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    windows = {kw["sliding_window"] for t, kw in zip(types, kwargs) if t == "sliding_attention"}
    if not windows:
        return None, False
    if len(windows) > 1:
        raise NotImplementedError(f"sliding layers with different windows {sorted(windows)} are not supported by "
                                  "decode.cache.RaggedCache (one window per model)")
    attn = [t for t in types if t in ("full_attention", "sliding_attention")]
    return int(windows.pop()), all(t == "sliding_attention" for t in attn)
