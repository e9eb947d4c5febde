"""Target features for feature-level drafters (Medusa, EAGLE, EAGLE-3): online, or read from the offline cache.

Alignment (the one rule every kind relies on): ``features[b, t]`` is the target's hidden state at the
position that saw ``input_ids[b, t]``, i.e. the state that predicts token ``t + 1``. Layers are indices
into transformers' ``output_hidden_states`` tuple: 0 = embeddings, ``i`` = output of decoder layer
``i-1`` (the input of layer ``i``), ``L`` = last layer AFTER the final norm (the LM head's input). The
decoder (``decode.engine``) hands drafters exactly these rows, so train and decode agree. Right padding
never changes a real position's state (causal attention); padded rows hold garbage and must be masked.

Online (``data.feature_cache: off``): one ``torch.no_grad`` target forward per batch; forward hooks keep
only the needed layers (``[B, T, H]`` each) instead of all ``L + 1`` hidden states.

Offline (``data.feature_cache: auto`` or a folder): ``train/feature_cache.py`` runs the target once over
the training set and writes bf16 shards (``drafterkit features RECIPE``); training batches then carry
``features`` and :func:`batch_features` returns them, with no target forward. Where a strategy needs the
target's logits, they come from the last layer through the LM head (:func:`target_logits`) either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from drafterkit.drafters.target.layers import target_body


def _check_layers(target: torch.nn.Module, layers: Sequence[int]) -> int:
    n = target.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= int(i) <= n]
    if bad or not layers:
        raise ValueError(f"feature layers {list(layers)} invalid: use hidden_states indices in [0, {n}] "
                         f"(0 = embeddings, {n} = last layer after the final norm)")
    return n


@torch.no_grad()
def target_hidden(target: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  layers: Sequence[int], method: str = "hooks") -> list[torch.Tensor]:
    """The target's hidden states at ``layers``: a list of ``[B, T, H]`` tensors (no grad).

    Args:
        input_ids, attention_mask: ``[B, T]`` right-padded.
        layers: ``output_hidden_states`` indices in ``[0, L]``.
        method: ``"hooks"`` (keep only the needed layers) or ``"hidden_states"`` (transformers'
            ``output_hidden_states=True``; the reference the hooks are tested against).

    Raises:
        ValueError: a layer index outside ``[0, L]`` or an unknown method.
    """
    n = _check_layers(target, layers)
    kw = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if method == "hidden_states":
        hs = target(output_hidden_states=True, logits_to_keep=1, **kw).hidden_states
        return [hs[int(i)] for i in layers]
    if method != "hooks":
        raise ValueError(f"unknown feature method {method!r}; use 'hooks' or 'hidden_states'")
    embed, decoder, norm = target_body(target)  # embed_tokens / layers / norm, by family
    got: dict[int, torch.Tensor] = {}

    def keep(idx):
        def hook(_mod, _inp, out):
            got[idx] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    handles = []
    for i in sorted({int(i) for i in layers}):
        mod = embed if i == 0 else (norm if i == n else decoder[i - 1])
        handles.append(mod.register_forward_hook(keep(i)))
    try:
        target.model(**kw)  # the body only: no [B, T, V] logits
    finally:
        for h in handles:
            h.remove()
    return [got[int(i)] for i in layers]


def target_features(target, input_ids, attention_mask, layers: Sequence[int], method: str = "hooks") -> torch.Tensor:
    """Concatenated features ``[B, T, len(layers) * H]`` (same order as ``layers``)."""
    return torch.cat(target_hidden(target, input_ids, attention_mask, layers, method), dim=-1)


@torch.no_grad()
def target_logits(target: torch.nn.Module, last_hidden: torch.Tensor) -> torch.Tensor:
    """The target's logits from its final-norm hidden state: ``[..., H] -> [..., V]`` (no grad), as its own
    forward computes them: the LM head, then the family's logit transform where its config has one
    (Granite's ``logits_scaling`` divides; Falcon-H1's ``lm_head_multiplier`` multiplies; Gemma-2's
    ``final_logit_softcapping`` caps with ``c * tanh(x / c)``)."""
    head = target.get_output_embeddings()
    logits = head(last_hidden.to(head.weight.dtype))
    c = target.config
    if getattr(c, "lm_head_multiplier", None):
        logits = logits * c.lm_head_multiplier
    if getattr(c, "logits_scaling", None):
        logits = logits / c.logits_scaling
    cap = getattr(c, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def batch_features(target, batch: dict[str, Any], layers: Sequence[int], cache: str | None = None) -> torch.Tensor:
    """Features for a training batch, ``[B, T, len(layers) * H]`` float32.

    Sources: ``batch["features"]`` when the batch comes from the offline cache
    (``train.feature_cache.FeatureCache.collate``; its ``feature_layers`` must equal ``layers``), else one
    online target forward under ``torch.no_grad``.

    Args:
        cache: the recipe's ``data.feature_cache`` when it is not ``off`` (from
            ``train.strategies.heads.feature_store``): the run reads the offline cache, so a batch
            without cached features is an error, never a silent target forward.

    Raises:
        ValueError: cached features of other layers or shape; a batch without features in an offline run.
    """
    ids = batch["input_ids"]
    if "features" in batch:
        f, held = batch["features"], [int(i) for i in batch.get("feature_layers", torch.tensor([])).tolist()]
        width = len(layers) * target.config.hidden_size
        if held != [int(i) for i in layers] or f.shape[:2] != ids.shape or f.shape[-1] != width:
            raise ValueError(f"cached features {tuple(f.shape)} of layers {held} do not match input_ids "
                             f"{tuple(ids.shape)} x layers {list(layers)} ({width} wide); the feature cache was "
                             "built for another drafter: rebuild it with `drafterkit features RECIPE`")
        return f.to(ids.device, torch.float32)
    if cache is not None:
        raise ValueError(f"the recipe reads the offline feature cache (data.feature_cache: {cache}) but this batch "
                         "carries no cached features; offline batches come from train.feature_cache.FeatureCache")
    return target_features(target, ids, batch["attention_mask"], layers).float()
