"""Refuse targets whose layers keep recurrent state: speculative decoding cannot roll it back.

Verification runs the target over the draft tokens and then drops the rejected ones: drafterkit's decoder crops
each attention layer's KV cache back to the accepted prefix (as vLLM and transformers' assisted generation do). A
layer that folds every token into one fixed-size state -- a Mamba / SSM block (Jamba, Falcon-H1, Bamba, Zamba,
Nemotron-H, Mamba itself), a linear-attention block (Qwen3-Next's Gated DeltaNet, MiniMax, Kimi-Linear), a short
convolution (LFM2), RecurrentGemma's RG-LRU or RWKV -- has no per-token entries to drop, so the rejected tokens
stay mixed into it (transformers raises "`crop` was called, but the current layer does not track past states").
:func:`recurrent_problem` reads that from the target's config alone: ``decode.generate`` refuses a loaded target
with it, and every verb refuses a target folder (its ``config.json``) before the weights load
(``drafters.target_recurrent.recurrent_target_problem``: train when its recipe is validated, eval, tune,
serve-check).

The rule follows transformers' own cache: ``DynamicCache`` builds one layer per entry of the text config's
``layer_types`` and gives ``conv`` / ``linear_attention`` / ``hybrid`` / ``hybrid_sliding`` entries a
``LinearAttentionLayer`` (recurrent state only); Jamba, Falcon-H1, Zamba and Bamba derive ``layer_types`` from
``layers_block_type`` (``mamba`` / ``hybrid``), RecurrentGemma from ``block_types`` (``recurrent``), Nemotron-H from
``hybrid_override_pattern`` (``M``: Mamba). A config.json read as JSON lacks those derived properties, so the keys
that configure the recurrent blocks count as well (``mamba_*``, ``ssm_*``, LFM2's ``conv_L_cache``,
``linear_conv_kernel_dim``, ...), and so do the model types that are recurrent throughout (Mamba, Mamba-2,
Falcon-Mamba, RWKV, xLSTM).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECURRENT_LAYER_TYPES", "recurrent_problem"]

#: ``layer_types`` / ``layers_block_type`` / ``block_types`` entries of layers that keep recurrent state
RECURRENT_LAYER_TYPES = frozenset({"conv", "linear_attention", "hybrid", "hybrid_sliding", "mamba", "mamba2",
                                   "recurrent", "ssm", "rwkv", "mlstm", "slstm"})
#: model types recurrent in every layer (their configs may list no layer types)
_RECURRENT_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"})
#: config keys that configure a recurrent block (present only in configs that have one)
_RECURRENT_KEY_PREFIXES = ("mamba_", "ssm_", "conv_L_", "linear_conv_", "linear_num_", "linear_key_", "linear_value_")
_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types")


def _fields(config: Any) -> tuple[dict, dict]:
    """``(values, listed)``: the decoder's config fields as a dict, and its layer lists (:data:`_LAYER_LISTS`,
    ``hybrid_override_pattern``) as transformers resolves them (a config object's properties included)."""
    if isinstance(config, dict):
        text = config.get("text_config")
        values = {**config, **text} if isinstance(text, dict) else dict(config)
        return values, {k: values[k] for k in (*_LAYER_LISTS, "hybrid_override_pattern") if k in values}
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    values = {**config.to_dict(), **text.to_dict()} if hasattr(text, "to_dict") else {}
    listed = {}
    for key in (*_LAYER_LISTS, "hybrid_override_pattern"):
        try:
            value = getattr(text, key, None)
        except Exception:  # a property over fields this config lacks
            value = None
        if value is None:
            value = values.get(key)
        if value is not None:
            listed[key] = value
    return values, listed


def recurrent_problem(config: Any, where: str = "the target") -> str | None:
    """Why a target of ``config`` cannot be verified by speculative decoding (its layers keep recurrent state
    that rejected draft tokens cannot be removed from), as one line naming ``where``, the family, the layers
    and what to do; ``None`` for a target whose layers are all attention (full, sliding-window, chunked).

    Args:
        config: a transformers config (a multimodal one's text config is read) or a ``config.json`` dict.
        where: how the message names the target (a folder, a Hub id).
    """
    values, listed = _fields(config)
    family = values.get("model_type") or "unknown"
    layers: list[str] = []
    for key in _LAYER_LISTS:
        entries = listed.get(key)
        if isinstance(entries, (list, tuple)):
            hits = [i for i, t in enumerate(entries) if str(t).lower() in RECURRENT_LAYER_TYPES]
            if hits:
                kinds = sorted({str(entries[i]) for i in hits})
                layers.append(f"its {key} makes layers {_ranges(hits)} of {len(entries)} {' / '.join(kinds)}")
                break
    pattern = listed.get("hybrid_override_pattern")
    if not layers and isinstance(pattern, str) and "M" in pattern:
        mamba = [i for i, c in enumerate(pattern) if c == "M"]
        layers.append(f"its hybrid_override_pattern makes layers {_ranges(mamba)} of {len(pattern)} Mamba")
    if not layers and family in _RECURRENT_MODEL_TYPES:
        layers.append("every layer recurrent")
    if not layers:
        keys = sorted(k for k in values if isinstance(k, str) and k.startswith(_RECURRENT_KEY_PREFIXES))
        if keys:
            layers.append(f"its config sets {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}: Mamba / SSM / "
                          "linear-attention blocks")
    if not layers:
        return None
    return (f"{where} ({family}) has recurrent / linear-attention layers ({layers[0]}) whose state drafterkit's "
            "verification cannot roll back to the accepted draft tokens; speculative decoding with it is not "
            "supported: use a target whose layers are all attention (full or sliding-window)")


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)
