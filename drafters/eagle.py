"""EAGLE head (EAGLE-1: Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"): a one-layer autoregressive drafter at the FEATURE level.

Feature used: the target's last hidden state AFTER the final norm, ``f_t = hidden_states[L][t]`` (the
input of the target's LM head), so the target's LM head applies to a predicted feature directly (no
extra norm). Row ``t`` is the state at the position that saw token ``t`` (it predicts token ``t+1``).

Head at position ``t``::

    x_t = fc([embed(token_{t+1}); f_t])            # [2H] -> [H], with bias (as EAGLE-1)
    f'_{t+1} = DecoderLayer(x_{<=t})[t]             # one Llama decoder layer (no input norm), causal
    logits(token_{t+2}) = lm_head(f'_{t+1})         # the target's frozen LM head

Embedding and LM head are borrowed frozen from the target (not saved). Decoding runs the head
autoregressively over its own predicted features with its own KV cache (one cache per row, RoPE
positions = token positions), and re-synchronises with the target's real features of accepted
tokens each round using ``state.num_stable`` (stale entries are cut, real ones recomputed).
Training (``forward``) runs the same chain for every position at once: a training-time-test unroll
(:meth:`FeatureHeadDrafter.unroll`) whose step ``j >= 1`` reads the head's own predicted feature and
greedy draft token of step ``j-1`` at RoPE position ``t+j``, as :meth:`FeatureHeadDrafter.propose` does.

The layers (attention with an explicit boolean mask and KV cache, Llama MLP, RMSNorm, the decoder
layer, the masks) live in :mod:`drafters.heads.layers`; the decoding this kind shares with EAGLE-3 (the per-row
cache runner, chains and trees) is :class:`drafters.heads.feature_head.FeatureHeadDrafter`, which this module
feeds through its two hooks (``real_input``, ``logits_and_ids``). Parameter names follow the Llama / vLLM
EAGLE naming (``self_attn.q_proj``, ``mlp.gate_proj``, ``post_attention_layernorm``, ``hidden_norm``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from drafterkit.drafters.heads.feature_head import (
    FeatureHeadDrafter,
    borrow,
    init_layer_from_target,
    target_shape_fields,
)
from drafterkit.drafters.heads.layers import DraftDecoderLayer


@dataclass
class EagleConfig:
    """EAGLE-1 head. ``vocab_size``/``hidden_size``/``target_num_layers`` are the target's; the
    decoder layer copies its attention shape and intermediate size unless overridden."""

    vocab_size: int
    hidden_size: int
    target_num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @classmethod
    def from_target(cls, target: nn.Module, **kw) -> EagleConfig:
        return cls(**{**target_shape_fields(target), **kw})


class EagleDrafter(FeatureHeadDrafter):
    """EAGLE-1 head: ``fc(2H -> H)`` + one decoder layer, target embedding / LM head borrowed frozen."""

    kind = "eagle"
    config_class = EagleConfig
    borrowed_prefixes = ("embed.", "lm_head.")

    def __init__(self, config: EagleConfig, target: nn.Module | None = None, init_from_target: bool = False):
        super().__init__(config)
        self.embed, self.lm_head = borrow(target, config, self.kind)
        c = config
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=True)
        self.layer = DraftDecoderLayer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                       c.intermediate_size, c.rms_norm_eps, c.rope_theta, eagle3=False)
        self.feature_layers = (c.target_num_layers,)
        if init_from_target:
            init_layer_from_target(self.layer, target)

    def real_input(self, feats: torch.Tensor) -> torch.Tensor:
        return feats  # f_t as is; fc is applied in _run together with the token embedding

    def _layer(self, ids, hidden, positions, mask, past):
        x = self.fc(torch.cat([self.embed(ids).to(hidden.dtype), hidden], -1))
        out, kv = self.layer(x, positions, mask, None if past is None else past[0])
        return out, (kv,)  # one layer: a per-layer cache of one

    def logits_and_ids(self, out: torch.Tensor):
        return self.lm_head(out.to(self.lm_head.weight.dtype)), None

    def target_vocab_size(self) -> int:
        return self.config.vocab_size

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, steps: int = 1,
                keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Training pass: the head unrolled ``steps`` steps on its OWN predicted features and greedy draft
        tokens (:meth:`FeatureHeadDrafter.unroll` with ``feed="draft"``), as decoding runs it.

        ``input_ids [B, T]``, ``features [B, T, H]`` (target ``hidden_states[L]``, possibly noised) ->
        ``steps`` predicted features ``[B, T, H]``: ``out[j][:, t]`` estimates ``features[:, t+1+j]`` (its
        LM head logits predict token ``t+2+j``); entries past the sequence are garbage. Right padding needs
        no mask: queries at real positions only see earlier (real) keys. ``keep``: see ``unroll``."""
        return self.unroll(input_ids, features, steps, feed="draft", keep=keep)
