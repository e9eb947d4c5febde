"""DFlash block drafter ("DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036), in
the layout vLLM's ``qwen3_dflash`` loader reads (``DFlashDraftModel``).

One drafter pass drafts a whole block. Features: the target's hidden states at ``feature_layers``
(transformers ``hidden_states`` ids, as for EAGLE-3), concatenated and fused into the context
``c_t = hidden_norm(fc([h_l1; h_l2; ...]_t))`` (``[nF*H] -> [H]``). The block is
``[last committed token, mask x (B-1)]`` embedded with the target's FROZEN embedding (the mask is the
target's row ``mask_token_id``), at RoPE positions ``n-1 .. n+B-2`` (``n`` = committed tokens). Each of
the ``num_layers`` Qwen3-style decoder layers (q/k per-head RMSNorm, pre-norm residual stream) attends

* the context keys/values ``k_norm(k_proj(c_t))`` (RoPE at ``t``) / ``v_proj(c_t)`` for every position
  ``t < n-1`` the target has processed, injected into EVERY layer (its own k/v projections), and
* the block's own keys/values, NON-causally (every block position sees the whole block).

``norm`` then the LM head give logits at block positions ``1..B-1``: position ``j`` is the draft of
token ``n-1+j``, so one pass proposes up to ``B-1`` draft tokens. The LM head is the target's (frozen,
not saved) for a full vocabulary, or, with ``draft_vocab_size < vocab_size``, the drafter's own over the
most frequent target ids with ``d2t`` / ``t2d`` as EAGLE-3 (``drafters.eagle3.mapping_from_ids``).

Tensor names are vLLM's (``fc.weight``, ``hidden_norm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.self_attn.{q,k}_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``, ``layers.{i}.input_layernorm``,
``layers.{i}.post_attention_layernorm``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``), so the
``vllm-dflash`` export (:mod:`drafters.export.writers`) is the checkpoint's tensors as saved.

Feature layer ids: id ``i`` is ``hidden_states[i]`` (the output of target layer ``i-1``); vLLM's
``dflash_config.target_layer_ids`` names the same layer ``i - 1`` (it captures the input of layer
``id + 1``), so valid ids are ``1 <= i <= L-1``.

Decoding: each row keeps its context keys/values per layer (a cache re-synchronised with
``num_stable``: the context of a committed token never changes); one block pass per round over
``[last committed token, mask x S]`` where ``S = min(K, B-1)`` for K draft tokens asked, as vLLM's
``DFlashProposer`` runs ``[bonus, mask x num_speculative_tokens]``: the block attends non-causally, so its length
moves the logits of every position, and a drafter served at K drafts what it drafts here at K (``mask_slots``
fixes S instead); draft position ``j`` is chosen from its own distribution ``q_j`` (the block's positions do not
read each other's draft tokens), so rejection sampling stays exact; ``draft_threshold`` cuts the chain where the
product of ``q_j`` of its tokens falls below it (``decode.cutoff.ChainCutoff``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from drafterkit.decode.cutoff import ChainCutoff
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.decode.sampling import greedy_argmax, mask_unproposable, select_tokens
from drafterkit.drafters.base import Drafter
from drafterkit.drafters.block_pass import block_pass, warm_up
from drafterkit.drafters.eagle3 import adopt_draft_vocab, mapping_from_ids
from drafterkit.drafters.heads.feature_head import check_target_shape, target_shape_fields
from drafterkit.drafters.heads.layers import DraftAttention, DraftMLP, RMSNorm


def default_feature_layers(num_layers: int, count: int = 3) -> list[int]:
    """``count`` ids spread evenly over ``[2, L-2]`` (DFlash's target layers 1..L-3, named as vLLM's
    ``target_layer_ids`` + 1), clamped into ``[1, L-1]`` and de-duplicated (a small target gets fewer)."""
    lo, hi = 2, num_layers - 2
    raw = [lo] if count == 1 else [round(lo + j * (hi - lo) / (count - 1)) for j in range(count)]
    return sorted({min(max(i, 1), max(num_layers - 1, 1)) for i in raw})


def check_dflash_feature_layers(layers, num_layers: int, kind: str = "dflash") -> None:
    """Raise ``ValueError`` (naming ``kind``: dflash or dspark) unless ``layers`` are distinct increasing ids in
    ``[1, L-1]`` (what vLLM's ``dflash_config.target_layer_ids`` can name: ``id - 1`` in ``[0, L-2]``)."""
    layers = [int(i) for i in layers]
    if not layers or layers != sorted(set(layers)) or layers[0] < 1 or layers[-1] > num_layers - 1:
        raise ValueError(f"{kind} feature_layers must be distinct increasing hidden_states ids in [1, {num_layers - 1}]"
                         f" for a target of {num_layers} layers (vLLM's target_layer_ids = id - 1), got {layers}")


@dataclass
class DFlashConfig:
    """DFlash drafter. Target sizes as :func:`drafters.heads.feature_head.target_shape_fields`; ``num_layers`` draft
    layers; ``block_size`` B (B-1 draft tokens per pass); ``draft_vocab_size`` (0: the target's vocabulary
    and its frozen LM head); ``mask_token_id``: the target embedding row fed at the B-1 masked positions."""

    kind = "dflash"  # named in its errors (not a field)
    vocab_size: int
    hidden_size: int
    target_num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_layers: int = 1
    block_size: int = 8
    draft_vocab_size: int = 0
    mask_token_id: int = 0
    feature_layers: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.feature_layers:
            self.feature_layers = default_feature_layers(self.target_num_layers)
        self.feature_layers = [int(i) for i in self.feature_layers]
        check_dflash_feature_layers(self.feature_layers, self.target_num_layers, self.kind)
        self.draft_vocab_size = int(self.draft_vocab_size) or self.vocab_size
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}], "
                             f"got {self.draft_vocab_size}")
        if self.block_size < 2 or self.num_layers < 1:
            raise ValueError(f"{self.kind} needs block_size >= 2 and num_layers >= 1, "
                             f"got {self.block_size}, {self.num_layers}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must be a target token id in [0, {self.vocab_size}), "
                             f"got {self.mask_token_id}")

    @classmethod
    def from_target(cls, target: nn.Module, **kw) -> DFlashConfig:
        base = {**target_shape_fields(target), **kw}
        base["draft_vocab_size"] = min(base.get("draft_vocab_size") or base["vocab_size"], base["vocab_size"])
        return cls(**base)


class DFlashAttention(DraftAttention):
    """Qwen3 attention (per-head q/k RMSNorm, RoPE) over the context keys/values followed by the block's own.

    ``forward(x [B, S, H], positions [B, S], ctx (k, v) [B, n_kv, C, d], mask [B, 1, S, C+S] bool or None)
    -> [B, S, H]``."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float, eps: float):
        super().__init__(hidden, hidden, heads, kv_heads, head_dim, rope_theta)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor,
                   cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return self.apply_rope(k, cos_sin or self.rope(positions, k.dtype)), v

    def forward(self, x, positions, ctx, mask=None):
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        cos_sin = self.rope(positions, q.dtype)
        q = self.apply_rope(q, cos_sin)
        k, v = self.project_kv(x, positions, cos_sin)
        k, v = torch.cat([ctx[0], k], 2), torch.cat([ctx[1], v], 2)
        out = self.attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class DFlashLayer(nn.Module):
    """One Qwen3 decoder layer of the drafter (pre-norm): ``x + attn(input_layernorm(x))`` then the MLP."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                         c.rope_theta, c.rms_norm_eps)
        self.mlp = DraftMLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, positions, ctx, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(Drafter):
    """DFlash block drafter: fc + hidden_norm over fused target features, ``num_layers`` Qwen3 layers with the
    context injected as keys/values, non-causal within the block, norm, LM head (target's or reduced)."""

    kind = "dflash"
    config_class = DFlashConfig
    supports_draft_threshold = True
    #: block position 0 (the last committed token) drafts too (DSpark's anchor-as-first-prediction: a block of B
    #: positions drafts B tokens, each the next token); False: DFlash's B-1 masked positions draft
    anchor_predicts = False
    #: a round's block pass runs as one compiled graph in ``decode.compiled_mode`` (``drafters/block_pass.py``)
    compiled_steps = True

    def __init__(self, config: DFlashConfig, target: nn.Module | None = None):
        super().__init__(config)
        c = config
        if target is None:
            raise ValueError("dflash drafter borrows the target's embedding (and LM head): pass target=... "
                             "(from_pretrained(path, target=target))")
        self.embed_tokens = target.get_input_embeddings()
        head = target.get_output_embeddings()
        hidden = self.embed_tokens.weight.shape[1]
        if tuple(head.weight.shape) != (c.vocab_size, c.hidden_size) or hidden != c.hidden_size:
            raise ValueError(f"dflash config expects vocab {c.vocab_size} x hidden {c.hidden_size}, "
                             "the target's LM head "
                             f"is {list(head.weight.shape)}; train the drafter for this target")
        self.full_vocab = c.draft_vocab_size == c.vocab_size
        self.borrowed_prefixes = ("embed_tokens.", "lm_head.") if self.full_vocab else ("embed_tokens.",)
        self.fc = nn.Linear(len(c.feature_layers) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if self.full_vocab:
            self.lm_head = head
        else:
            self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
            d2t, t2d = mapping_from_ids(torch.arange(c.draft_vocab_size), c.vocab_size)
            self.register_buffer("d2t", d2t)
            self.register_buffer("t2d", t2d)
        self.feature_layers = tuple(c.feature_layers)
        self._mask_slots: int | None = None

    @property
    def draft_slots(self) -> int:
        """Draft tokens one full block pass proposes: ``block_size - 1`` (the masked positions), ``block_size``
        where :attr:`anchor_predicts`."""
        return self.config.block_size - (0 if self.anchor_predicts else 1)

    @property
    def mask_slots(self) -> int | None:
        """Mask positions of every block pass, fixed (one draft token each), or None (the default): a pass asked
        for K draft tokens then runs ``min(K, block_size - 1)`` slots, the block ``[bonus token, mask x K]``
        vLLM's ``DFlashProposer`` runs at ``num_speculative_tokens = K``. Because every block position attends
        every other, the block's length moves every position's logits (by a few hundredths in a 40-step
        drafter), so only this rule drafts what vLLM drafts at each K. A decode-time setting, not saved.

        Raises:
            ValueError: (setting) not None or an int in ``[1, block_size - 1]``.
        """
        return self._mask_slots

    @mask_slots.setter
    def mask_slots(self, value: int | None) -> None:
        most = self.draft_slots
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most):
            raise ValueError(f"mask_slots must be None or an int in [1, {most}] ({most} draft positions were "
                             f"trained), got {value!r}")
        self._mask_slots = value

    def slots_for(self, k: int) -> int:
        """Mask slots of a block pass asked for ``k`` draft tokens: :attr:`mask_slots` where set, else
        ``min(k, block_size - 1)`` (vLLM's block at ``num_speculative_tokens = k``)."""
        return self._mask_slots or max(1, min(k, self.draft_slots))

    # --- vocabulary ----------------------------------------------------------------------------------
    def draft_ids(self) -> torch.Tensor | None:
        """Target id of each draft id ``[N]``, or None for the full vocabulary (draft id == target id)."""
        if self.full_vocab:
            return None
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, ids: torch.Tensor, target: nn.Module | None = None) -> None:
        """Use the sorted target ids ``ids [N]`` as the draft vocabulary; with ``target``, start the LM head
        rows and ``norm`` from the target's. Raises ``ValueError`` for a full-vocabulary drafter or a wrong count."""
        if self.full_vocab or ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"set_draft_vocab needs a reduced-vocabulary dflash drafter and exactly "
                             f"draft_vocab_size={self.config.draft_vocab_size} ids, got {ids.numel()}")
        adopt_draft_vocab(self, ids, target)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Drafter output (pre-norm) ``[..., H]`` -> logits over the draft vocabulary ``[..., N]``."""
        x = self.norm(hidden)
        return self.lm_head(x.to(self.lm_head.weight.dtype))

    # --- the block pass --------------------------------------------------------------------------------
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Fused target features ``[B, C, nF*H]`` -> context states ``hidden_norm(fc(.)) [B, C, H]``."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's context keys/values ``[B, n_kv, C, d]`` from context states ``[B, C, H]`` at
        ``positions [B, C]``."""
        return [layer.self_attn.project_kv(ctx, positions) for layer in self.layers]

    def block(self, ids: torch.Tensor, positions: torch.Tensor, kv, mask=None) -> torch.Tensor:
        """Block tokens ``ids [B, S]`` at ``positions [B, S]`` through the layers, attending the context
        ``kv`` (per layer) and each other under ``mask [B, 1, S, C+S]`` (None: everything) -> ``[B, S, H]`` pre-norm."""
        x = self.embed_tokens(ids).to(self.fc.weight.dtype)
        for layer, ctx in zip(self.layers, kv):
            x = layer(x, positions, ctx, mask)
        return x

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor,
                return_hidden: bool = False) -> torch.Tensor:
        """Training pass: one block after each anchor, all blocks of a sequence in one pass.

        Args:
            input_ids: ``[B, T]``. features: ``[B, T, nF*H]`` (row ``t`` = the target's state at the position
                that saw token ``t``, concatenated over ``feature_layers``).
            anchors: LongTensor ``[B, A]``: block starts ``a`` (0 <= a < T; -1 = unused slot). Block ``a`` holds
                ``[token a, mask x (B-1)]`` at positions ``a .. a+B-1``, attends the context of positions
                ``< a`` and its own block (non-causally): exactly what :meth:`propose` runs after a prefix of
                ``a + 1`` tokens.

        Returns:
            ``[B, A, S, N]`` draft logits (``[..., H]`` pre-norm outputs with ``return_hidden``), S =
            :attr:`draft_slots`: entry ``[b, i, s]`` drafts token ``anchors[b, i] + s + 1``.
        """
        bsz, t = input_ids.shape
        a_n, blk, dev = anchors.shape[1], self.config.block_size, input_ids.device
        off = torch.arange(blk, device=dev)
        start = anchors.clamp(min=0)  # [B, A]
        ids = torch.full((bsz, a_n, blk), self.config.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = input_ids.gather(1, start)
        pos = (start[..., None] + off).reshape(bsz, a_n * blk)  # [B, A*Bs]
        ctx_pos = torch.arange(t, device=dev)[None].expand(bsz, t)
        kv = self.context_kv(self.context(features), ctx_pos)
        see_ctx = ctx_pos[:, None, :] < anchors[..., None]  # [B, A, T]
        see_ctx = see_ctx[:, :, None, :].expand(bsz, a_n, blk, t).reshape(bsz, a_n * blk, t)
        blocks = torch.arange(a_n, device=dev).repeat_interleave(blk)
        same = (blocks[:, None] == blocks[None, :])[None].expand(bsz, -1, -1)
        mask = torch.cat([see_ctx, same], -1)[:, None]  # [B, 1, A*Bs, T + A*Bs]
        first = 0 if self.anchor_predicts else 1
        out = self.block(ids.reshape(bsz, a_n * blk), pos, kv, mask).reshape(bsz, a_n, blk, -1)[:, :, first:]
        return out if return_hidden else self.draft_logits(out)

    # --- decoding ----------------------------------------------------------------------------------
    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        super().check_compatible(target, vocab_size)
        check_target_shape(self, target)

    def reset(self, batch_size: int) -> None:
        self._caches: list[dict | None] = [None] * batch_size

    def _context_rows(self, rows: list[int], features: list[torch.Tensor], stable: list[int]) -> list[list]:
        """Per-layer context keys/values ``[(k [1, Hkv, m, D], v)]`` of each decoder row in ``rows``, over its
        feature rows ``0..m-1`` (``features[b] [m, nF*H]``), reusing the rows cached for a prefix still stable
        (``stable[b]``). Rows that need the same new range are computed in one batch."""
        dev = self.fc.weight.device
        done: dict[int, list] = {}
        groups: dict[tuple[int, int], list[int]] = {}
        for b in rows:
            m, cache = features[b].shape[0], self._caches[b]
            valid = 0 if cache is None else min(cache["rows"], stable[b], m)
            if cache is not None and valid == cache["rows"] == m:
                done[b] = cache["kv"]
            else:
                groups.setdefault((valid, m), []).append(b)
        for (valid, m), group in groups.items():
            feats = torch.stack([features[b][valid:m] for b in group]).to(dev)  # [G, m - valid, nF*H]
            pos = torch.arange(valid, m, device=dev)[None].expand(len(group), -1)
            kv_new = self.context_kv(self.context(feats), pos)
            for g, b in enumerate(group):
                kv = [(k[g:g + 1], v[g:g + 1]) for k, v in kv_new]
                if valid > 0:
                    kv = [(torch.cat([k[:, :, :valid], nk], 2), torch.cat([v[:, :, :valid], nv], 2))
                          for (k, v), (nk, nv) in zip(self._caches[b]["kv"], kv)]
                self._caches[b] = {"rows": m, "kv": kv}
                done[b] = kv
        return [done[b] for b in rows]

    def block_logits(self, rows: list[int], tokens: list[list[int]], features: list[torch.Tensor],
                     stable: list[int], slots: int | None = None) -> torch.Tensor:
        """:meth:`block_hidden` through ``norm`` and the LM head: ``[R, S, N]`` draft-vocabulary logits."""
        return self.block_outputs(rows, tokens, features, stable, slots)[1]

    def block_outputs(self, rows: list[int], tokens: list[list[int]], features: list[torch.Tensor],
                      stable: list[int], slots: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden [R, S, H], logits [R, S, N])``: :meth:`block_hidden` and its draft logits; one row's round is one
        compiled graph in ``decode.compiled_mode`` (``drafters.block_pass.block_pass``)."""
        if len(rows) == 1 and (got := block_pass(self, rows[0], tokens[rows[0]], features[rows[0]],
                                                 stable[rows[0]], slots)) is not None:
            return got
        hidden = self.block_hidden(rows, tokens, features, stable, slots)
        return hidden, self.draft_logits(hidden)

    def warm_up_compiled(self, k: int = 5) -> None:
        """Compile the block-pass graphs of a batch-1 decode with chains of ``k`` (``drafters.block_pass.warm_up``);
        ``decode.warm.warm_up_proposer`` calls it in ``decode.compiled_mode``."""
        warm_up(self, k)

    def block_hidden(self, rows: list[int], tokens: list[list[int]], features: list[torch.Tensor],
                     stable: list[int], slots: int | None = None) -> torch.Tensor:
        """One block pass for the decoder rows ``rows`` together (``tokens[b]``: row b's committed tokens,
        ``features[b] [len(tokens[b])-1, nF*H]``, ``stable[b]``: its ``num_stable``; ``slots`` S: the block's
        draft positions, default :meth:`slots_for` ``(block_size)``): pre-norm outputs ``[R, S, H]`` of the draft
        positions; ``[r, s]`` drafts token ``len(tokens[rows[r]])+s``. Contexts of different lengths are
        right-padded and masked."""
        dev = self.fc.weight.device
        first = 0 if self.anchor_predicts else 1
        blk = (slots or self.slots_for(self.config.block_size)) + first
        kvs = self._context_rows(rows, features, stable)
        lens = [kv[0][0].shape[2] for kv in kvs]
        cmax, r_n = max(lens), len(rows)
        kv = []
        for li in range(len(self.layers)):  # right-pad every row's context to cmax: [R, Hkv, cmax, D]
            k, v = (pad_sequence([row[li][j][0].transpose(0, 1) for row in kvs], batch_first=True).transpose(1, 2)
                    for j in (0, 1))
            kv.append((k, v))
        see = torch.arange(cmax + blk, device=dev)[None] < torch.tensor(lens, device=dev)[:, None]
        see[:, cmax:] = True
        ids = torch.full((r_n, blk), self.config.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = torch.tensor([tokens[b][-1] for b in rows], device=dev)
        pos = torch.tensor([len(tokens[b]) - 1 for b in rows], device=dev)[:, None] + torch.arange(blk, device=dev)
        mask = see[:, None, None, :].expand(r_n, 1, blk, cmax + blk)
        return self.block(ids, pos, kv, mask)[:, first:]

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Up to ``k`` draft tokens per row from ONE block pass over all rows of :meth:`slots_for` ``(K)`` mask
        slots, K = ``state.num_draft_tokens`` (the decoding's K: a round near the end asks fewer than K and
        still runs K's block, as vLLM does), ``k`` where that is 0 (see the module docstring); ``lengths`` caps
        the chain at the block's slots and where ``draft_threshold`` cuts it. Rows without target context yet
        (one token) or inactive propose nothing.

        Raises:
            ValueError: the decoder passed no features (``feature_layers`` was ignored).
        """
        if state.features is None:
            raise ValueError(f"{self.kind} needs target features; the decoder must honour feature_layers")
        if not hasattr(self, "_caches") or len(self._caches) != len(state.tokens):
            self.reset(len(state.tokens))
        v, b_all = self.config.vocab_size, len(state.tokens)
        last = torch.tensor([t[-1] if t[-1] < state.vocab_size else 0 for t in state.tokens])
        tokens = last[:, None].repeat(1, k)
        probs = None if sampling.greedy else F.one_hot(tokens, v).float()
        lengths = torch.zeros(b_all, dtype=torch.long)
        rows = [b for b in range(b_all) if state.active[b] and len(state.tokens[b]) >= 2]
        slots = self.slots_for(state.num_draft_tokens or k)
        if rows:
            with torch.no_grad():
                t, q, n = self.draft_rows(rows, state, last[rows], k, slots, sampling, generator)
            tokens[rows], lengths[rows] = t, n
            if probs is not None:
                probs[rows] = q
        capped = self.draft_threshold > 0 or k > slots or self.cuts_chains()
        return Proposal(tokens=tokens, probs=probs, lengths=lengths if capped else None)

    def draft_rows(self, rows: list[int], state: DecodeState, last: torch.Tensor, k: int, slots: int,
                   sampling: SamplingParams, generator: torch.Generator | None):
        """The drafts of the decoder rows ``rows`` (``last [R]``: their last committed tokens) from one block pass of
        ``slots`` positions: ``(tokens [R, k], q [R, k, V] or None when greedy, lengths [R])``, every position
        chosen from its own distribution (:func:`select_parallel`). DSpark adds its sequential stage here."""
        logits = self.block_logits(rows, state.tokens, state.features, state.num_stable, slots)  # [R, S, N]
        return select_parallel(logits, k, sampling, generator, state.vocab_size, self.draft_ids(),
                               self.config.vocab_size, self.draft_threshold)

    def cuts_chains(self) -> bool:
        """Whether :meth:`draft_rows` may cut a chain short of ``k`` by itself (beyond the block's positions and
        ``draft_threshold``); DFlash's never does."""
        return False


def select_parallel(logits: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None,
                    vocab_size: int, ids: torch.Tensor | None, target_vocab: int, threshold: float):
    """Chains of draft tokens from per-position logits that do not read each other's draft tokens (DFlash's
    block, P-EAGLE's parallel positions): position ``i`` is chosen from its own distribution ``q_i``, which is
    exactly what rejection sampling needs.

    Args:
        logits: ``[R, S, N]`` draft-vocabulary logits of R rows at S positions.
        k: chain length asked for; positions past ``S`` repeat the last token and are cut by ``lengths``.
        vocab_size: ids the decoder may propose; ``ids [N]``: target id of each draft id (None: identity);
        target_vocab: ``V`` of the returned ``q``; threshold: ``draft_threshold`` (``decode.cutoff.ChainCutoff``).

    Returns:
        ``(tokens [R, k] target ids, q [R, k, V] or None when greedy, lengths [R])``; past a row's length (the
        positions' end, or the ``draft_threshold`` cut) tokens repeat the last one (q one-hot there).
    """
    r_n, v = logits.shape[0], target_vocab
    if ids is not None and bool((ids >= vocab_size).any()):  # reduced draft vocabulary: mask ids past vocab_size
        logits = mask_unproposable(logits, ids, vocab_size)
    steps = min(k, logits.shape[1])
    cut = ChainCutoff(threshold, r_n, steps)
    picked, qs = [], []
    if sampling.greedy:  # every position's argmax at once: select_tokens' choice, one pass over the logits
        best = greedy_argmax(logits[:, :steps], vocab_size if ids is None else None)  # [R, steps]
        for i in range(steps):
            cut.update(i, best[:, i], logits=logits[:, i])  # a no-op without a threshold
        picked = list((best if ids is None else ids[best]).unbind(1))
    for i in range(0 if sampling.greedy else steps):
        tok, p = select_tokens(logits[:, i], sampling, vocab_size if ids is None else None, generator)
        cut.update(i, tok, logits=logits[:, i], probs=p)
        picked.append(tok if ids is None else ids[tok])
        if p is not None:
            q = p.float()
            qs.append(q if ids is None else q.new_zeros(r_n, v).scatter_(1, ids[None].expand(r_n, -1), q))
    n = cut.lengths if cut.lengths is not None else torch.full((r_n,), steps, dtype=torch.long)
    tokens, q = torch.stack(picked, 1).cpu(), torch.stack(qs, 1).cpu() if qs else None
    return pad_chains(tokens, q, n, k, v)


def pad_chains(tokens: torch.Tensor, q: torch.Tensor | None, n: torch.Tensor, k: int, v: int):
    """Chains of ``k`` from ``tokens [R, S]`` (``q [R, S, V]`` or None) of which row ``r`` keeps ``n[r]``: past a
    row's length tokens repeat its last kept one (the first when none) and ``q`` is one-hot there. Returns
    ``(tokens [R, k], q [R, k, V] or None, n)``."""
    r_n, steps = tokens.shape
    fill = torch.arange(k)[None] >= n[:, None]  # [R, k]: past the row's length
    at = (n - 1).clamp(min=0)
    rep = tokens.gather(1, at[:, None])  # the last proposed token (or the first when none)
    tokens = torch.cat([tokens, rep.expand(r_n, k - steps)], 1) if k > steps else tokens
    tokens = torch.where(fill, rep, tokens)
    if q is not None:
        if k > steps:
            q = torch.cat([q, q.new_zeros(r_n, k - steps, v)], 1)
        q = torch.where(fill[..., None], F.one_hot(tokens, v).float(), q)
    return tokens, q, n


def card_line(cfg: dict, export_config: dict | None) -> str:
    """The model card's line on a DFlash drafter whose ``config.json`` config is ``cfg`` (its export's
    config: ``export_config``; ``drafters.kinds.Kind.card_line``)."""
    return (f"DFlash: {cfg.get('num_layers')} draft layer(s) reading target layers {cfg.get('feature_layers')} "
            f"(`hidden_states[i]`; vLLM `target_layer_ids` i - 1) as keys/values, one non-causal pass over a "
            f"block of {cfg.get('block_size')} drafts {int(cfg.get('block_size', 2)) - 1} tokens, draft vocabulary "
            f"{cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')} target tokens")
