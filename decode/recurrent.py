"""Which targets with recurrent state ``decode.generate`` verifies exactly, and a one-line refusal for the rest.

Verification runs the target over the draft tokens and then drops the rejected ones: drafterkit's decoder crops
each attention layer's KV cache back to the accepted prefix (as vLLM and transformers' assisted generation do). A
layer that folds every token into one fixed-size state -- a Mamba / SSM block (Jamba, Falcon-H1, Bamba, Zamba,
Nemotron-H, Granite-4.0-H, Mamba itself), a linear-attention block (Qwen3.5's and Qwen3-Next's Gated DeltaNet,
MiniMax, Kimi-Linear), a short convolution (LFM2), RecurrentGemma's RG-LRU or RWKV -- has no per-token entries to
drop. For the families of :data:`ROLLBACK_MODEL_TYPES` the decoder keeps the state at every position of a
verification pass and selects, per row, the one after the accepted tokens (``decode.recurrent_cache``, vLLM's
per-position states): chain drafts, single rows and ragged batches, are exact there, as plain decoding is -- hybrids
(Qwen3.5, Qwen3-Next, Nemotron-H, Granite-4.0-H, Falcon-H1, LFM2, LFM3, Jamba, Bamba, Zamba2, Kimi-Linear,
Bailing-hybrid, OLMo-hybrid) and the all-recurrent Mamba, Mamba-2 and Falcon-Mamba. Still refused, by
:func:`recurrent_problem`: tree drafts on any target with recurrent layers (``for_trees=True``: a state per tree
node is not kept), and every recurrent family outside that set, each of :data:`UNRECORDED` with the reason its state
cannot be recorded per position (Zamba, RecurrentGemma, MiniMax, xLSTM, RWKV).
``decode.generate`` asks it for a loaded target, and the verbs ask it for a target folder (its ``config.json``)
before the weights load (``drafters.target.recurrent.recurrent_target_problem``).

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

__all__ = ["RECURRENT_LAYER_TYPES", "ROLLBACK_MODEL_TYPES", "UNRECORDED", "recurrent_layers", "recurrent_problem"]

#: ``layer_types`` / ``layers_block_type`` / ``block_types`` entries of layers that keep recurrent state
RECURRENT_LAYER_TYPES = frozenset({"conv", "linear_attention", "hybrid", "hybrid_sliding", "mamba", "mamba2",
                                   "recurrent", "ssm", "rwkv", "mlstm", "slstm"})
#: model types recurrent in every layer (their configs may list no layer types)
_RECURRENT_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"})
#: config keys that configure a recurrent block (present only in configs that have one)
_RECURRENT_KEY_PREFIXES = ("mamba_", "ssm_", "conv_L_", "linear_conv_", "linear_num_", "linear_key_", "linear_value_")
_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types")
#: model types (a multimodal config's text model type) whose recurrent state ``decode.generate`` rolls back exactly
#: after a chain verification pass: transformers 5.25 records their per-position states
#: (``Cache.activate_past_recording``); each is proven on a tiny target by tests/test_decode_hybrid_targets.py
ROLLBACK_MODEL_TYPES = frozenset({"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "nemotron_h", "granitemoehybrid",
                                  "falcon_h1", "lfm2", "lfm2_moe", "jamba", "bamba", "zamba2", "mamba", "mamba2",
                                  "falcon_mamba", "kimi_linear", "olmo_hybrid", "lfm3", "bailing_hybrid"})
#: recurrent model types checked on a tiny target and refused, with what stops their exact rollback
#: (tests/test_decode_recurrent.py checks each reason on a loaded target)
UNRECORDED = {
    "zamba": "transformers runs Zamba's Mamba scan over a pass at once and keeps only its final state, so no "
             "per-position state is recorded to roll back to",
    "recurrent_gemma": "RecurrentGemma keeps its RG-LRU and convolution states on the model's modules, outside the "
                       "cache, so no per-position state is recorded to roll back to",
    "minimax": "MiniMax runs only with its own MiniMaxCache, not the cache whose per-position states the decoder "
               "records",
    "xlstm": "xLSTM keeps its state in its own xLSTMCache, not the cache whose per-position states the decoder "
             "records",
    "rwkv": "RWKV carries its state through its own `state` argument, not a transformers cache, so no per-position "
            "state is recorded to roll back to",
}


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


def _recurrent(config: Any) -> tuple[str, str | None, list[int] | None]:
    """``(family, description, layers)``: the config's model type, how its recurrent layers show (None: none do)
    and their indices (None where only the model type or the config keys say so)."""
    values, listed = _fields(config)
    family = values.get("model_type") or "unknown"
    for key in _LAYER_LISTS:
        entries = listed.get(key)
        if isinstance(entries, (list, tuple)):
            hits = [i for i, t in enumerate(entries) if str(t).lower() in RECURRENT_LAYER_TYPES]
            if hits:
                kinds = sorted({str(entries[i]) for i in hits})
                return family, f"its {key} makes layers {_ranges(hits)} of {len(entries)} {' / '.join(kinds)}", hits
    pattern = listed.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        mamba = [i for i, c in enumerate(pattern) if c == "M"]
        return family, f"its hybrid_override_pattern makes layers {_ranges(mamba)} of {len(pattern)} Mamba", mamba
    if family in _RECURRENT_MODEL_TYPES:
        return family, "every layer recurrent", None
    keys = sorted(k for k in values if isinstance(k, str) and k.startswith(_RECURRENT_KEY_PREFIXES))
    if keys:
        return family, (f"its config sets {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}: Mamba / SSM / "
                        "linear-attention blocks"), None
    return family, None, None


def recurrent_layers(config: Any) -> list[int] | None:
    """Indices of the decoder layers that keep recurrent state (Mamba / SSM, linear attention, short convolution),
    as transformers' cache builds them: ``[]`` for a target whose layers are all attention, None where the config
    says it has recurrent blocks but not which layers (a ``config.json`` read as JSON whose layer list transformers
    derives, or a model type recurrent throughout).

    Args:
        config: a transformers config (a multimodal one's text config is read) or a ``config.json`` dict.
    """
    _, description, layers = _recurrent(config)
    return [] if description is None else layers


def recurrent_problem(config: Any, where: str = "the target", *, for_trees: bool = False) -> str | None:
    """Why ``decode.generate`` cannot verify draft tokens exactly on a target of ``config``, as one line naming
    ``where``, the family, the recurrent layers and what to do; ``None`` for a target whose layers are all
    attention (full, sliding-window, chunked) or a hybrid of :data:`ROLLBACK_MODEL_TYPES` verifying chains.

    Args:
        config: a transformers config (a multimodal one's text config is read) or a ``config.json`` dict.
        where: how the message names the target (a folder, a Hub id).
        for_trees: the drafts are trees (static or dynamic): refused on any recurrent layer, since a tree node's
            state is not the state after a prefix of the pass.
    """
    family, description, _ = _recurrent(config)
    if description is None:
        return None
    if family in ROLLBACK_MODEL_TYPES:
        if not for_trees:
            return None
        return (f"{where} ({family}) has recurrent / linear-attention layers ({description}): tree drafts would need "
                "a recurrent state per tree node, which drafterkit's decoder does not keep; use chain drafts "
                "(tree=None; drafterkit eval --tree chain)")
    why = f" ({UNRECORDED[family]})" if family in UNRECORDED else ""
    return (f"{where} ({family}) has recurrent / linear-attention layers ({description}) whose state drafterkit's "
            f"verification cannot roll back to the accepted draft tokens{why}: exact rollback covers "
            f"{', '.join(sorted(ROLLBACK_MODEL_TYPES))} only; speculative decoding with it is not supported: use one "
            "of those or a target whose layers are all attention (full or sliding-window)")


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
