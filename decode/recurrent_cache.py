"""Exact rollback of recurrent layer state after a verification pass: per-position states, vLLM's way.

A target with recurrent layers (Qwen3.5's, Qwen3-Next's and OLMo-hybrid's Gated DeltaNet, Kimi-Linear's Delta
Attention, the Mamba-2 of Nemotron-H, Granite-4.0-H, Falcon-H1, Bamba, Zamba2 and Mamba-2, the Mamba of Jamba, Mamba
and Falcon-Mamba, LFM2's short convolutions) keeps, per recurrent layer, a convolution state (the last ``K`` inputs
of its causal convolution, ``[B, C, K]``) and, except LFM2, an SSM / linear-attention state (``[B, H, ...]``) that
folds in every token it is fed. A verification pass feeds ``m`` tokens (the last committed one and the draft
tokens), of which row ``b`` keeps only the first ``kept[b]``; its recurrent state must then be the state after
exactly those tokens.

vLLM keeps the state after every position of the pass and selects the accepted one (its hybrid models'
speculative decoding); transformers 5.25 can do the same for assisted generation
(``Cache.activate_past_recording``), but crops every row by the same count. :class:`RecurrentStates` switches that
recording on for every recurrent layer after the prompt pass, with no bound on the states a pass keeps, so a pass
of ``m`` tokens runs each recurrent layer one token at a time (the step plain decoding runs, no chunked scan) and
leaves the convolution inputs of all ``m`` tokens (``[B, C, K + m]``) and the state before each token beside the
last one; :meth:`RecurrentStates.select` then keeps, per row, the convolution window and the state after its
``kept[b]`` tokens. Nothing is re-run. Attention layers are cropped by :class:`decode.cache.RaggedCache` as
before. A drafter that steps a draft model and later drops its draft tokens takes :meth:`RecurrentStates.snapshot`
first and :meth:`RecurrentStates.restore` after.

Trees are not covered: a tree's nodes are not a sequence, so a node's state is not a prefix state of the pass
(``decode.recurrent.recurrent_problem(..., for_trees=True)`` refuses them up front).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

__all__ = ["RecurrentStates"]

#: states a pass keeps per recurrent layer: all of them (transformers computes that many tokens step by step)
_EVERY_POSITION = 1 << 30


class RecurrentStates:
    """The recurrent layers of one transformers ``DynamicCache`` (``LinearAttentionLayer`` and the hybrid
    ``LinearAttention...AttentionLayer`` entries), and their per-row rollback. Falsy when the cache has none."""

    def __init__(self, cache) -> None:
        self.layers = [layer for layer in getattr(cache, "layers", [])
                       if isinstance(layer, LinearAttentionCacheLayerMixin)]

    def __bool__(self) -> bool:
        return bool(self.layers)

    def record(self) -> None:
        """After the prompt pass: every later pass keeps the convolution inputs and the state at every position
        (until :meth:`select`). Each state index gets its own history list (transformers shares one)."""
        for layer in self.layers:
            layer.activate_past_recording(recurrent_states_to_keep=_EVERY_POSITION)
            layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}

    def select(self, kept: torch.Tensor, m: int) -> None:
        """After a pass of ``m`` tokens: row ``b`` keeps the state after its first ``kept[b]`` tokens
        (``kept [B]``, ``0 <= kept <= m``; 0 = the state before the pass).

        Raises:
            RuntimeError: a layer's recorded convolution inputs or states do not cover the pass (recording was
                not on, or a pass went unselected).
        """
        counts = [int(n) for n in kept.tolist()]  # one host read; the rows' counts pick the states below
        same = counts[0] if len(set(counts)) == 1 else None  # one row, or every row kept alike: no gather
        for layer in self.layers:
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    layer.conv_states[i] = _conv_window(layer.conv_states[i], layer.conv_kernel_size[i], counts, m)
                if layer.is_recurrent_states_initialized[i]:
                    history = layer.recurrent_states_history[i]  # the state before each token of the pass
                    if len(history) != m:
                        raise RuntimeError(f"a recurrent layer recorded {len(history)} states for a pass of {m} "
                                           "tokens; RecurrentStates.record must run after the prompt pass and select "
                                           "after every pass")
                    state = layer.recurrent_states[i]  # [B, ...], after all m tokens
                    if same is not None:
                        if same < m:
                            state.copy_(history[same])
                    else:
                        for b, n in enumerate(counts):
                            if n < m:
                                state[b].copy_(history[n][b])
                    layer.recurrent_states_history[i] = []

    def set_length(self, length: int) -> None:
        """Set every recurrent layer's token count (``get_seq_length``) to ``length`` cache columns, as the
        attention layers hold."""
        for layer in self.layers:
            layer.cumulative_length_linear.fill_(int(length))

    def snapshot(self) -> list:
        """Copies of every layer's convolution and recurrent states (recorded histories must be empty)."""
        return [([None if s is None else s.clone() for s in layer.conv_states.values()],
                 [None if s is None else s.clone() for s in layer.recurrent_states.values()]) for layer in self.layers]

    def restore(self, snap: list) -> None:
        """Put back the states of :meth:`snapshot` and drop any recorded history."""
        for layer, (convs, recs) in zip(self.layers, snap):
            for i, (conv, rec) in enumerate(zip(convs, recs)):
                if conv is not None:
                    layer.conv_states[i] = conv.clone()
                if rec is not None:
                    layer.recurrent_states[i].copy_(rec)
                if getattr(layer, "record_past", False):
                    layer.recurrent_states_history[i] = []


def _conv_window(full: torch.Tensor, k: int, counts: list[int], m: int) -> torch.Tensor:
    """``full [B, ..., K + m]`` (the window before a pass, then its ``m`` inputs) -> ``[B, ..., K]``: row ``b``'s
    window after its first ``counts[b]`` inputs."""
    if full.shape[-1] != k + m:
        raise RuntimeError(f"a recurrent layer's convolution holds {full.shape[-1]} inputs after a pass of {m} tokens "
                           f"(kernel {k}); RecurrentStates.record must run after the prompt pass and select after "
                           "every pass")
    if len(set(counts)) == 1:
        return full[..., counts[0]: counts[0] + k].contiguous()
    return torch.stack([full[b, ..., n: n + k] for b, n in enumerate(counts)])
