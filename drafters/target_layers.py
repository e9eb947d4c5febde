"""A target's decoder layer read in Llama terms, for the drafters initialised from the target.

EAGLE / EAGLE-3 heads (Li et al. 2024, 2025) and DFlash's draft layers start from the target's last decoder
layer(s). Their modules carry Llama / vLLM names (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm`` = the norm before attention, ``post_attention_layernorm`` = the norm before the MLP,
``self_attn.{q,k}_norm`` per head). :func:`llama_layer_tensors` maps a target layer of any family onto those
names where the mapping is well defined:

* fused projections (Phi-3): ``qkv_proj [(n_q + 2 n_kv) d, H]`` splits into q / k / v rows,
  ``gate_up_proj [2 I, H]`` into gate (first half) and up (second half), as Phi-3's MLP chunks it;
* norms are read by what they compute: the effective scale of an RMSNorm is ``norm(ones)``, so Gemma's
  ``(1 + weight)`` norms map to the scale the drafter's plain ``weight * x`` norm needs;
* the norm before the MLP is ``pre_feedforward_layernorm`` where the layer has one (Gemma-2 / 3, whose
  ``post_attention_layernorm`` normalises the attention OUTPUT), else ``post_attention_layernorm`` of a
  pre-norm layer (one with an ``input_layernorm``);
* post-norm layers (OLMo-2: ``post_attention_layernorm`` / ``post_feedforward_layernorm`` after attention
  and MLP, no norm before either) have no norm a pre-norm drafter layer can take: the projections map, the
  drafter's norms keep their default init (ones);
* mixture-of-experts MLPs (Qwen3-MoE, gpt-oss) have no dense MLP to copy: attention and norms map, the
  drafter's MLP keeps its default init;
* biases (Qwen2's q/k/v, gpt-oss's) and attention sinks have no place in the drafter's bias-free layer and
  are not copied; an MLP with another activation (Gemma's GeLU-tanh) is copied as weights, a starting
  point rather than the target's own function.

A target whose decoder layers are not found (``model.layers`` or ``get_decoder().layers``) or whose
attention has neither q/k/v nor a ``qkv_proj`` that splits by the config's head counts cannot start a
drafter from its layers: :func:`init_refusal` says why, and the recipe is refused when validated
(``train.options``) naming the option to change.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["copy_matching", "decoder_layers", "feature_refusal", "init_refusal", "llama_layer_tensors",
           "norm_scale"]


def decoder_layers(target: nn.Module) -> list[nn.Module] | None:
    """The target's decoder layers (``target.model.layers`` or ``target.get_decoder().layers``), or None."""
    body = getattr(target, "model", None)
    if body is None or not hasattr(body, "layers"):
        try:
            body = target.get_decoder()
        except (AttributeError, NotImplementedError):
            return None
    layers = getattr(body, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) and len(layers) else None


def _weight(module: nn.Module | None, name: str) -> torch.Tensor | None:
    sub = getattr(module, name, None) if module is not None else None
    w = getattr(sub, "weight", None) if isinstance(sub, nn.Module) else None
    return w if isinstance(w, torch.Tensor) and w.dim() == 2 else None


def _head_sizes(config) -> tuple[int, int]:
    """``(n_q * d, n_kv * d)``: the rows of q and of k (= v) in the target's attention."""
    heads = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads * d, (getattr(config, "num_key_value_heads", None) or heads) * d


def _attention(layer: nn.Module, config) -> dict[str, torch.Tensor] | None:
    """``{q,k,v,o}_proj`` weights of the layer's attention (fused ``qkv_proj`` split), or None."""
    attn = getattr(layer, "self_attn", None)
    q, k, v = (_weight(attn, n) for n in ("q_proj", "k_proj", "v_proj"))
    o = _weight(attn, "o_proj")
    if q is None or k is None or v is None:
        fused = _weight(attn, "qkv_proj")
        q_rows, kv_rows = _head_sizes(config)
        if fused is None or fused.shape[0] != q_rows + 2 * kv_rows:
            return None
        q, k, v = fused.split([q_rows, kv_rows, kv_rows], 0)
    if o is None:
        return None
    return {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
            "self_attn.o_proj.weight": o}


def _mlp(layer: nn.Module) -> dict[str, torch.Tensor]:
    """``mlp.{gate,up,down}_proj`` weights of a dense gated MLP (fused ``gate_up_proj`` split); ``{}`` for
    anything else (experts, an ungated MLP)."""
    mlp = getattr(layer, "mlp", None)
    down = _weight(mlp, "down_proj")
    gate, up = _weight(mlp, "gate_proj"), _weight(mlp, "up_proj")
    if gate is None or up is None:
        fused = _weight(mlp, "gate_up_proj")
        if fused is None or fused.shape[0] % 2:
            return {}
        gate, up = fused.chunk(2, 0)
    if down is None or down.shape[1] != gate.shape[0]:
        return {}
    return {"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": down}


def norm_scale(norm: nn.Module | None) -> torch.Tensor | None:
    """The effective per-channel scale of an RMSNorm, ``norm(c * ones)`` (``weight`` for Llama's, ``1 + weight``
    for Gemma's; ``c = 1e3`` makes ``eps`` vanish below fp32 rounding), or None when ``norm`` is not a
    1-D-weighted norm. On the meta device (a recipe check) the
    result is a meta tensor: its shape is what counts there."""
    w = getattr(norm, "weight", None)
    if not isinstance(norm, nn.Module) or not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None
    if getattr(norm, "bias", None) is not None:  # LayerNorm: norm(ones) is its bias, not a scale
        return None
    with torch.no_grad():
        x = torch.full((1, w.shape[0]), 1e3, device=w.device, dtype=torch.float32)
        return norm(x).reshape(-1).to(w.dtype)


def _norms(layer: nn.Module, attn: nn.Module | None) -> dict[str, torch.Tensor]:
    """The pre-attention / pre-MLP norms and the per-head q/k norms, under their Llama names."""
    out = {}
    pre_attn = getattr(layer, "input_layernorm", None)
    if pre_attn is not None:
        pre_mlp = getattr(layer, "pre_feedforward_layernorm", None) or getattr(layer, "post_attention_layernorm", None)
    else:  # a post-norm layer (OLMo-2): no norm sits before attention or the MLP
        pre_mlp = None
    for name, norm in (("input_layernorm.weight", pre_attn), ("post_attention_layernorm.weight", pre_mlp),
                       ("self_attn.q_norm.weight", getattr(attn, "q_norm", None)),
                       ("self_attn.k_norm.weight", getattr(attn, "k_norm", None))):
        s = norm_scale(norm)
        if s is not None:
            out[name] = s
    return out


def llama_layer_tensors(layer: nn.Module, config) -> dict[str, torch.Tensor]:
    """The tensors of one target decoder layer under Llama names (see the module docstring for the mapping).

    Args:
        layer: a transformers decoder layer of any family.
        config: the target's config (head counts, to split a fused ``qkv_proj``).

    Returns:
        ``{llama name: tensor}`` for every part that maps (``self_attn.{q,k,v,o}_proj.weight`` ``[out, in]``,
        ``mlp.{gate,up,down}_proj.weight``, ``input_layernorm.weight`` / ``post_attention_layernorm.weight``
        ``[H]``, ``self_attn.{q,k}_norm.weight``); parts that do not map are absent. Tensors may be views of
        the target's: copy them, never write through them.

    Raises:
        ValueError: the layer's attention projections cannot be mapped (:func:`init_refusal` says why first).
    """
    attn = _attention(layer, config)
    if attn is None:
        raise ValueError(f"{type(layer).__name__} has no q/k/v (or qkv_proj) and o_proj projections to copy")
    return {**attn, **_mlp(layer), **_norms(layer, getattr(layer, "self_attn", None))}


def init_refusal(target: nn.Module, option: str) -> str | None:
    """Why a drafter cannot start from ``target``'s decoder layers, as one line naming the family and the
    recipe ``option`` to change; None when it can. ``target`` may live on the meta device (built from its
    config alone, as the recipe check does)."""
    family = getattr(target.config, "model_type", type(target).__name__)
    layers = decoder_layers(target)
    if layers is None:
        return (f"{option}: initialising from the target's decoder layers is not defined for model type "
                f"{family!r} ({type(target).__name__} has no model.layers); set {option}=false")
    if _attention(layers[-1], target.config) is None:
        return (f"{option}: initialising from the target's decoder layers is not defined for model type "
                f"{family!r} ({type(layers[-1]).__name__} has no q/k/v or qkv_proj and o_proj projections); "
                f"set {option}=false")
    return None


def feature_refusal(target: nn.Module, kind: str) -> str | None:
    """Why drafter ``kind`` cannot read ``target``'s hidden states (training hooks the body's
    ``embed_tokens``, ``layers`` and final ``norm``, ``train.features``), as one line naming the family and
    the kind to use instead; None when it can. ``target`` may live on the meta device."""
    body = getattr(target, "model", None)
    missing = [n for n in ("embed_tokens", "layers", "norm") if not isinstance(getattr(body, n, None), nn.Module)]
    if not missing:
        return None
    family = getattr(target.config, "model_type", type(target).__name__)
    return (f"drafter.kind: drafter kind {kind!r} reads the target's hidden states through model.embed_tokens / "
            f"model.layers / model.norm, and model type {family!r} ({type(target).__name__}) has no "
            f"model.{missing[0]}; set drafter.kind=draft_lm (a draft model over the same tokenizer)")


@torch.no_grad()
def copy_matching(module: nn.Module, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Copy ``tensors`` into ``module``'s parameters of the same name and shape; returns the names copied."""
    done = []
    for name, p in module.named_parameters():
        src = tensors.get(name)
        if src is not None and tuple(src.shape) == tuple(p.shape):
            p.copy_(src)
            done.append(name)
    return done
