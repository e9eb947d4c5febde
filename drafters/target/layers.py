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

Hybrid targets (Qwen3.5, Qwen3-Next, Nemotron-H, Granite-4.0-H, Falcon-H1, LFM2) mix recurrent layers (Gated
DeltaNet, Mamba-2, short convolutions) with attention; a recurrent layer has no q/k/v to copy, so the layer a drafter
starts from is the LAST decoder layer whose attention maps (:func:`source_layer_ids`; the last layer itself for
an attention-only target). Their layouts map too: Nemotron-H's attention block is ``mixer`` under ``norm``; LFM2's
attention has ``out_proj`` and ``{q,k}_layernorm``, its MLP ``w1`` / ``w3`` / ``w2`` (gate, up, down) under
``operator_norm`` / ``ffn_norm``; Falcon-H1's MLP is ``feed_forward`` after ``pre_ff_layernorm``; the gated
attention of Qwen3.5 / Qwen3-Next (``q_proj`` of ``2 n_q d`` rows, per head the query then its output gate) gives
its query rows, the gate having no place in the drafter. A heterogeneous config (Gemma-4: full-attention layers
take ``global_head_dim``) is read per layer (:func:`layer_config`), never through its ambiguous global attributes.

A target whose decoder layers are not found (``model.layers`` or ``get_decoder().layers``) or none of whose layers
has attention that maps (q/k/v or a ``qkv_proj`` that splits by the head counts; DeepSeek's multi-head latent
attention has neither) cannot start a drafter from its layers: the drafter's layers then start fresh (their
default init), and :func:`fresh_init_note` is the one line training prints to say so.
"""

from __future__ import annotations

import torch
from torch import nn

from drafterkit.decode.recurrent import recurrent_layers

__all__ = ["copy_matching", "decoder_layers", "feature_refusal", "fresh_init_note", "layer_config",
           "llama_layer_tensors", "norm_scale", "recurrent_truncation_refusal", "source_layer_ids", "target_body"]


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


def layer_config(config, index: int):
    """The config decoder layer ``index`` is built from: a heterogeneous config's per-layer view (Gemma-4, whose
    global ``head_dim`` is ambiguous: transformers raises on reading it), else ``config`` itself."""
    try:
        heterogeneous = bool(getattr(config, "is_heterogeneous", False))
    except Exception:  # a config whose properties read fields it lacks
        heterogeneous = False
    return config.per_layer_config[index] if heterogeneous else config


def _head_sizes(config) -> tuple[int, int]:
    """``(n_q * d, n_kv * d)``: the rows of q and of k (= v) in the target's attention (a layer's config)."""
    heads = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads * d, (getattr(config, "num_key_value_heads", None) or heads) * d


def _attention_module(layer: nn.Module) -> nn.Module | None:
    """The layer's attention: ``self_attn``, or Nemotron-H's ``mixer`` where it is attention (has q/k/v)."""
    for name in ("self_attn", "mixer"):
        attn = getattr(layer, name, None)
        if isinstance(attn, nn.Module) and any(_weight(attn, n) is not None for n in ("q_proj", "qkv_proj")):
            return attn
    return None


def _attention(layer: nn.Module, config) -> dict[str, torch.Tensor] | None:
    """``{q,k,v,o}_proj`` weights of the layer's attention (fused ``qkv_proj`` split, a gated query's gate rows
    dropped), or None. ``config``: the layer's (:func:`layer_config`)."""
    attn = _attention_module(layer)
    q, k, v = (_weight(attn, n) for n in ("q_proj", "k_proj", "v_proj"))
    o = _weight(attn, "o_proj")
    if o is None:
        o = _weight(attn, "out_proj")  # LFM2
    if q is None or k is None or v is None:
        fused = _weight(attn, "qkv_proj")
        q_rows, kv_rows = _head_sizes(config)
        if fused is None or fused.shape[0] != q_rows + 2 * kv_rows:
            return None
        q, k, v = fused.split([q_rows, kv_rows, kv_rows], 0)
    elif q.shape[0] == 2 * _head_sizes(config)[0] and getattr(attn, "head_dim", None):
        d = attn.head_dim  # Qwen3.5 / Qwen3-Next: per head [query (d rows); output gate (d rows)]
        q = q.view(-1, 2 * d, q.shape[1])[:, :d].reshape(-1, q.shape[1])
    if o is None:
        return None
    return {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
            "self_attn.o_proj.weight": o}


def _mlp(layer: nn.Module) -> dict[str, torch.Tensor]:
    """``mlp.{gate,up,down}_proj`` weights of a dense gated MLP (fused ``gate_up_proj`` split; Falcon-H1's
    ``feed_forward``, LFM2's ``w1`` / ``w3`` / ``w2``); ``{}`` for anything else (experts, an ungated MLP)."""
    mlp = getattr(layer, "mlp", None)
    if mlp is None:
        mlp = getattr(layer, "feed_forward", None)
    down = _weight(mlp, "down_proj")
    gate, up = _weight(mlp, "gate_proj"), _weight(mlp, "up_proj")
    if down is None and _weight(mlp, "w2") is not None:  # LFM2: w2(silu(w1 x) * w3 x)
        gate, up, down = _weight(mlp, "w1"), _weight(mlp, "w3"), _weight(mlp, "w2")
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


def _first(module: nn.Module | None, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module):
            return sub
    return None


def _norms(layer: nn.Module, attn: nn.Module | None) -> dict[str, torch.Tensor]:
    """The pre-attention / pre-MLP norms and the per-head q/k norms, under their Llama names."""
    out = {}
    pre_attn = _first(layer, ("input_layernorm", "operator_norm"))  # LFM2: operator_norm
    if pre_attn is None and getattr(layer, "mixer", None) is attn:  # Nemotron-H: a block is norm -> mixer
        pre_attn = _first(layer, ("norm",))
    if pre_attn is not None:
        pre_mlp = _first(layer, ("pre_feedforward_layernorm", "post_attention_layernorm", "pre_ff_layernorm",
                                 "ffn_norm"))
    else:  # a post-norm layer (OLMo-2): no norm sits before attention or the MLP
        pre_mlp = None
    for name, norm in (("input_layernorm.weight", pre_attn), ("post_attention_layernorm.weight", pre_mlp),
                       ("self_attn.q_norm.weight", _first(attn, ("q_norm", "q_layernorm"))),
                       ("self_attn.k_norm.weight", _first(attn, ("k_norm", "k_layernorm")))):
        s = norm_scale(norm)
        if s is not None:
            out[name] = s
    return out


def llama_layer_tensors(layer: nn.Module, config) -> dict[str, torch.Tensor]:
    """The tensors of one target decoder layer under Llama names (see the module docstring for the mapping).

    Args:
        layer: a transformers decoder layer of any family.
        config: the layer's config (:func:`layer_config`; head counts, to split a fused ``qkv_proj``).

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
    return {**attn, **_mlp(layer), **_norms(layer, _attention_module(layer))}


def source_layer_ids(target: nn.Module, count: int = 1) -> list[int]:
    """Indices of the last ``count`` decoder layers whose attention maps onto the drafter's (fewer when fewer
    have it; ``[]`` when none does or the layers are not found): the last layers of an attention-only target,
    the last full-attention layers of a hybrid one. ``target`` may live on the meta device."""
    layers = decoder_layers(target)
    if layers is None:
        return []
    ids = [i for i, layer in enumerate(layers) if _attention_maps(layer, layer_config(target.config, i))]
    return ids[-count:] if count > 0 else []


def _attention_maps(layer: nn.Module, config) -> bool:
    """Whether :func:`_attention` maps the layer, read from the weights' shapes alone (no view of them: a sharded
    target's layers are checked before they are gathered)."""
    attn = _attention_module(layer)
    if attn is None or (_weight(attn, "o_proj") is None and _weight(attn, "out_proj") is None):
        return False
    if all(_weight(attn, n) is not None for n in ("q_proj", "k_proj", "v_proj")):
        return True
    fused, (q_rows, kv_rows) = _weight(attn, "qkv_proj"), _head_sizes(config)
    return fused is not None and fused.shape[0] == q_rows + 2 * kv_rows


def fresh_init_note(target: nn.Module, kind: str) -> str | None:
    """The one line training prints when drafter ``kind`` asked to start from the target's decoder layers
    (``init_from_target_layer``) but none maps onto its Llama layer, so its layers start fresh (their default
    init); None when a layer maps. ``target`` may live on the meta device."""
    if source_layer_ids(target):
        return None
    family = getattr(target.config, "model_type", type(target).__name__)
    layers = decoder_layers(target)
    what = (f"{type(target).__name__} has no model.layers" if layers is None else
            f"no {type(layers[-1]).__name__} has q/k/v (or qkv_proj) and o_proj projections to copy")
    return (f"drafter.options.init_from_target_layer: the {kind} drafter's layers start fresh (default init): "
            f"{what} in this {family} target; set drafter.options.init_from_target_layer=false to say so")


def recurrent_truncation_refusal(target: nn.Module, num_layers: int) -> str | None:
    """Why a draft LM made of a hybrid target's first ``num_layers`` layers could not decode, one line naming the
    option and the fix, or None: when those layers are all recurrent (Qwen3.5's Gated DeltaNet, Mamba, LFM2's
    convolutions) the draft has no attention layer, and transformers builds its attention masks from the cache's
    attention layers ("`get_mask_sizes` can only be called on Attention layers"), so it cannot run with a cache,
    in ``decode.generate`` or in its own ``generate``. ``target`` may live on the meta device."""
    if not recurrent_layers(target.config):  # attention throughout ([]), or nothing the check can read
        return None
    layers = decoder_layers(target) or []
    with_attention = [i for i, layer in enumerate(layers) if _attention_module(layer) is not None
                      or isinstance(getattr(layer, "self_attn", None), nn.Module)
                      or isinstance(getattr(getattr(layer, "shared_transformer", None), "self_attn", None), nn.Module)]
    # (Zamba2's hybrid layers run its shared attention block: ``shared_transformer.self_attn``)
    if not with_attention or with_attention[0] < num_layers:
        return None
    first, family = with_attention[0], getattr(target.config, "model_type", type(target).__name__)
    fix = (f"set drafter.options.num_layers to at least {first + 1}" if first + 1 < len(layers) else
           "set drafter.options.init=scratch")
    return (f"drafter.options.num_layers: the first {num_layers} layers of this {family} target are all recurrent "
            f"(its first attention layer is layer {first}), and a draft LM without an attention layer cannot decode "
            f"(transformers builds its attention masks from the cache's attention layers); {fix}")


#: the body's input embedding and final norm, by family: ``embed_tokens`` / ``norm`` (Llama and most), Nemotron-H's
#: ``embeddings`` / ``norm_f``, Falcon-H1's ``final_layernorm``, LFM2's ``embedding_norm`` (applied after the last
#: layer, whatever its name says)
_EMBED_NAMES = ("embed_tokens", "embeddings")
_FINAL_NORM_NAMES = ("norm", "norm_f", "final_layernorm", "embedding_norm")


def target_body(target: nn.Module) -> tuple[nn.Module | None, nn.ModuleList | None, nn.Module | None]:
    """``(input embedding, decoder layers, final norm)`` of ``target.model`` (None where absent): the modules
    whose outputs are ``hidden_states[0]``, ``hidden_states[1..L-1]`` and ``hidden_states[L]`` (``train.features``
    hooks them)."""
    body = getattr(target, "model", None)
    layers = getattr(body, "layers", None)
    return (_first(body, _EMBED_NAMES), layers if isinstance(layers, nn.ModuleList) else None,
            _first(body, _FINAL_NORM_NAMES))


def feature_refusal(target: nn.Module, kind: str) -> str | None:
    """Why drafter ``kind`` cannot read ``target``'s hidden states (training hooks the body's input embedding,
    ``layers`` and final norm, :func:`target_body`), as one line naming the family and the kind to use instead;
    None when it can. ``target`` may live on the meta device."""
    parts = dict(zip(("embed_tokens", "layers", "norm"), target_body(target)))
    missing = [n for n, module in parts.items() if module is None]
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
