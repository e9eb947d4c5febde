"""The layers of the feature-level heads (EAGLE, EAGLE-3): attention with an explicit boolean mask and
KV cache, the Llama MLP, RMSNorm, one Llama decoder layer, and the causal and training-time-test masks.

Parameter names follow the Llama / vLLM EAGLE naming (``self_attn.q_proj``, ``mlp.gate_proj``,
``post_attention_layernorm``, ``hidden_norm``, ...), so an exported head loads without renames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rope_theta_of(config, layer_type: str | None = None) -> float:
    """RoPE base of a transformers config (``rope_parameters['rope_theta']`` or ``rope_theta``); where the
    parameters are given per layer type (Gemma-3 / 4: ``{"full_attention": {...}, "sliding_attention": {...}}``),
    those of ``layer_type`` (default: ``full_attention``)."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" not in params and isinstance(params.get(layer_type or "full_attention"), dict):
        params = params[layer_type or "full_attention"]
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DraftAttention(nn.Module):
    """Multi-head (grouped-query) attention with RoPE, an explicit boolean mask and an optional KV cache.

    ``forward(x [B, T, in_dim], positions [B, T], mask [T, S] or [B, 1, T, S] bool (True = may attend),
    past (k, v) [B, n_kv, S-T, d] or None) -> (out [B, T, H], (k, v) [B, n_kv, S, d])``.
    """

    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.rope_theta = rope_theta
        self._inv_freq: torch.Tensor | None = None  # float32 [d/2], see rope()

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables for ``positions [B, T]``: ``(cos, sin)``, each ``[B, 1, T, head_dim]`` in ``dtype``.

        The angles are float32 whatever dtype the module is cast to (a bf16 frequency table would round
        them by up to 0.4%, shifting the angle at position 1,000 by several radians); the inverse
        frequencies are computed once per device and kept outside the state dict and ``.to()``."""
        inv = self._inv_freq
        if inv is None or inv.device != positions.device:
            d = self.head_dim
            inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d))
            self._inv_freq = inv
        ang = positions.to(torch.float32)[..., None] * inv  # [B, T, d/2]
        emb = torch.cat((ang, ang), dim=-1)[:, None]  # [B, 1, T, d]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply_rope(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate ``x [B, n, T, d]`` by the tables of :meth:`rope` (rotate-half layout, as Llama)."""
        cos, sin = cos_sin
        return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor,
                   cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, T, in_dim]`` -> RoPE'd keys and values, each ``[B, n_kv, T, d]``."""
        b, t, _ = x.shape
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return self.apply_rope(k, cos_sin or self.rope(positions, k.dtype)), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention of ``q [B, heads, T, d]`` over ``k, v [B, n_kv, S, d]`` (grouped-query:
        each key/value head serves ``heads / n_kv`` query heads, without copying them) -> ``[B, heads, T, d]``."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim),
                                              enable_gqa=self.heads != self.kv_heads)

    def forward(self, x, positions, mask, past=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        cos_sin = self.rope(positions, q.dtype)
        q = self.apply_rope(q, cos_sin)
        k, v = self.project_kv(x, positions, cos_sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        out = self.attend(q, k, v, mask if mask.dim() == 4 else mask[None, None])
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftDecoderLayer(nn.Module):
    """One Llama decoder layer as EAGLE uses it.

    ``eagle3=False`` (EAGLE-1): input ``x [B, T, H]`` goes to attention without an input norm.
    ``eagle3=True`` (EAGLE-3, vLLM/SpecForge layout): attention reads
    ``[input_layernorm(embeds); hidden_norm(hidden)]`` (``2H`` wide); the residual is ``hidden``.
    ``llama=True``: a plain Llama layer, attention reads ``input_layernorm(hidden)`` (``H`` wide): the layers
    after the first of a multi-layer EAGLE-3 head (vLLM's ``llama_eagle3.LlamaDecoderLayer`` with
    ``layer_idx > 0``, which sees no embeddings).
    Output ``[B, T, H]`` (pre-norm residual stream: vLLM's ``hidden + residual``) and the layer's ``(k, v)``.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 eps: float, rope_theta: float, eagle3: bool = False, llama: bool = False):
        super().__init__()
        if eagle3 and llama:
            raise ValueError("a DraftDecoderLayer is EAGLE-1's, EAGLE-3's first layer or a plain Llama layer, "
                             "not both eagle3 and llama")
        self.eagle3, self.llama = eagle3, llama
        self.self_attn = DraftAttention(2 * hidden if eagle3 else hidden, hidden, heads, kv_heads, head_dim,
                                        rope_theta)
        self.mlp = DraftMLP(hidden, intermediate)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        if eagle3 or llama:
            self.input_layernorm = RMSNorm(hidden, eps)
        if eagle3:
            self.hidden_norm = RMSNorm(hidden, eps)

    def attn_input(self, hidden: torch.Tensor, embeds: torch.Tensor | None) -> torch.Tensor:
        if self.llama:
            return self.input_layernorm(hidden)
        if not self.eagle3:
            return hidden
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = hidden + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, hidden, positions, mask, past=None, embeds=None):
        a, kv = self.self_attn(self.attn_input(hidden, embeds), positions, mask, past)
        return self.finish(hidden, a), kv


def causal_mask(t: int, past: int, device=None) -> torch.Tensor:
    """Bool ``[t, past + t]``: query ``i`` (absolute ``past + i``) may attend key ``j`` iff ``j <= past + i``."""
    q = torch.arange(t, device=device)[:, None] + past
    return torch.arange(past + t, device=device)[None, :] <= q


def ttt_attention_mask(seq_len: int, step: int, device=None) -> torch.Tensor:
    """Bool ``[T, (step+1) * T]`` mask for training-time-test step ``step`` (True = may attend).

    Keys are the concatenation of steps ``0..step`` (``T`` each). Block 0 (the real prefix) is causal:
    query ``t`` sees keys ``s <= t``. Blocks ``1..step`` (the head's own earlier outputs) are diagonal:
    query ``t`` sees only key ``t`` of each. Raises ``ValueError`` for ``step < 0`` or ``seq_len < 1``.
    """
    if step < 0 or seq_len < 1:
        raise ValueError(f"ttt_attention_mask needs seq_len >= 1 and step >= 0, got {seq_len}, {step}")
    q = torch.arange(seq_len, device=device)
    blocks = [q[None, :] <= q[:, None]]
    eye = q[None, :] == q[:, None]
    blocks += [eye] * step
    return torch.cat(blocks, dim=1)
