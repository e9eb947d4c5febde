"""The target's forward in one function for Llama-layout decoders on a CPU: :func:`compact_forward`.

A transformers causal LM's forward is generic: per pass it builds its attention masks through
``masking_utils``, dispatches each layer's attention through a registry, routes keyword arguments through
every module call and collects outputs through hooks. At decoding sizes (one row, or the few rows of a
verification pass) on a CPU that framework work costs as much as the arithmetic: the default target
(SmolLM2-135M, 30 layers) makes ~4,700 small aten calls per step, and the linear layers take only ~70% of a
step's time on one thread. Compiled engines (vLLM's CPU graphs, gpt-fast) remove it; this module removes the
Python part of it with the same arithmetic, as one plain function over the model's own modules:

* one attention mask per pass (not per layer), and none where a pass sees every column of its rows;
* RMSNorm inline, in transformers' formula (fp32 variance, ``weight * x.to(dtype)``);
* the rotary embedding from the model's own ``rotary_emb`` (every RoPE scaling it implements), applied as
  transformers' ``apply_rotary_pos_emb``;
* linear layers called through their ``forward`` (the engine's merged / prepacked copies,
  :mod:`decode.fused`, where installed), attention through :func:`decode.attention.packed_gqa_sdpa` (the
  engine's multi-token attention) and the key/value cache through the model's own ``DynamicCache``, so
  :class:`decode.cache.RaggedCache` masks, crops and reorders it as before.

Covered families (:func:`compact_problem` says why a model is not): the ``model_type`` s in :data:`FAMILIES` with
SiLU MLPs, RMSNorm, full attention in every layer (no sliding window) and the ``"sdpa"`` attention
implementation: Llama 2 / 3 (SmolLM2), Qwen2 / 2.5, Qwen3 (its per-head q/k RMSNorm), Mistral without a window.
Anything else runs transformers' forward. The results are transformers' up to the order of floating-point
reductions that a different mask form can change inside SDPA (fp32: ~1e-6; ``tests/test_decode_compact.py``
compares logits, hidden states and whole decodes). In exact mode (:func:`decode.exact_mode`) its attention is
:func:`decode.attention.exact_sdpa` and its linear layers the engine's row-invariant calls, as in transformers'
forward, so greedy speculative decoding stays token-identical to plain decoding (``tests/test_decode_exact*.py``
run it).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.modeling_outputs import CausalLMOutputWithPast

from drafterkit.decode import attention

#: The name of a transformers model's KV-cache argument and output field: ``cache`` in the releases that renamed
#: it (5.2x, ``past_key_values`` deprecated until 5.40), ``past_key_values`` before (5.17, the GPU machine's).
#: Read from the library, not from a model's ``forward`` signature, which a wrapper (peft) hides behind **kwargs.
#: Under the wrong name a model takes the cache as an unknown keyword and ignores it, attending to the new
#: tokens alone.
CACHE_ARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

#: ``config.model_type`` s whose decoder layers this forward computes (Llama's layout)
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

#: set to ``False`` to run transformers' forward everywhere (``benchmarks/engine_parity.py`` compares both)
ENABLED = True


def compact_problem(model: nn.Module) -> str | None:
    """Why :func:`compact_forward` cannot run ``model`` (a clause), or None when it can."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FAMILIES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {', '.join(FAMILIES)}"
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or not hasattr(model, "lm_head") or not hasattr(body, "rotary_emb"):
        return f"{type(model).__name__} is not laid out as <family>ForCausalLM(model=<family>Model)"
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {cfg._attn_implementation!r} is not 'sdpa'"
    if "sliding_attention" in get_layer_types_and_kwargs(cfg)[0]:
        return "a layer has a sliding attention window"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU gate"
    if next(model.parameters()).device.type != "cpu":
        return "the model is not on the CPU"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(lin) is nn.Linear for lin in names):
            return "a projection is not a plain nn.Linear (LoRA, quantized)"
        if any(_hooked(m) for m in (layer, attn, mlp, *names)):
            return "a decoder layer has hooks"
    return None


def _hooked(module: nn.Module) -> bool:
    """Whether ``module`` has a forward hook other than transformers' output capture, which its forward installs
    on first ``output_hidden_states`` and which does nothing outside that forward."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return any(getattr(h, "__module__", None) != "transformers.utils.output_capturing" for h in hooks)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm`` (and Qwen2's, Qwen3's, Mistral's) with ``weight`` and ``eps``: variance in
    fp32 (``decode.compiled`` computes the same)."""
    h = x.to(torch.float32)
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """:func:`rms` with an RMSNorm module's weight and epsilon."""
    return rms(x, norm.weight, norm.variance_epsilon)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor ``[B, H, m, D]`` (cos, sin ``[B, 1, m, D]``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _mask(attention_mask: torch.Tensor | None, m: int) -> torch.Tensor | None:
    """The pass's attention mask ``[B or 1, 1, m, K]`` (bool: True = attend, or the additive float one given), or
    None where the ``m`` new tokens are the whole key axis (a prompt, causal) or one token that sees every column.
    One tensor per pass: :func:`decode.attention.exact_sdpa` plans each mask once, for every layer."""
    if attention_mask is None or attention_mask.dim() == 4:
        return attention_mask
    k = attention_mask.shape[1]
    cols = torch.arange(k, device=attention_mask.device)
    causal = cols[None, :] <= (k - m) + torch.arange(m, device=attention_mask.device)[:, None]  # [m, K]
    if bool(attention_mask.all()):
        return None if m == 1 or k == m else causal[None, None]
    return attention_mask[:, None, None, :].bool() & causal[None, None]


def _attend(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            exact: bool) -> torch.Tensor:
    """Attention of ``q [B, Hq, m, D]`` over ``k, v [B, Hkv, K, D]``: ``[B, m, Hq * D]``. ``exact``:
    :func:`decode.attention.exact_sdpa`; else the ``g = Hq / Hkv`` query heads of a
    group read their key/value head in one call, as ``g * m`` rows (as transformers packs a decoding step's), never
    a copy of the cache per query head (SDPA's ``enable_gqa`` on a CPU copies it)."""
    b, hq, m, d = q.shape
    if exact:
        out, _ = attention.exact_sdpa(attn, q, k, v, mask, scaling=attn.scaling)
        return out.reshape(b, m, hq * d)
    if mask is None and m == 1:  # a decoding step that sees every column: no mask at all
        out = torch.nn.functional.scaled_dot_product_attention(q.reshape(b, k.shape[1], -1, d), k, v,
                                                               scale=attn.scaling)
        return out.reshape(b, hq * d)[:, None]
    if mask is None:  # a prompt: causal over its own tokens
        mask = torch.ones(m, m, dtype=torch.bool, device=q.device).tril()[None, None]
    out, _ = attention.packed_gqa_sdpa(attn, q, k, v, mask, scaling=attn.scaling)  # [B, m, Hq, D]
    return out.reshape(b, m, hq * d)


@torch.no_grad()
def compact_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    position_ids: torch.Tensor, cache, logits_to_keep: int = 0,
                    output_hidden_states: bool = False, exact: bool = False) -> CausalLMOutputWithPast:
    """``model(input_ids, attention_mask=..., position_ids=..., cache=cache, use_cache=True, ...)`` for a model
    :func:`compact_problem` accepts, computed as one function (module docstring).

    Args:
        input_ids: ``[B, m]`` token ids. attention_mask: ``[B, K]`` (1 = a valid cache or new column, the new
            tokens' ``m`` columns last: they see the valid columns and each other causally) or a 4-D mask
            ``[B, 1, m, K]`` (bool or additive float) used as given; None = all valid.
        position_ids: ``[B, m]`` RoPE positions. cache: the model's ``DynamicCache``, appended to.
        logits_to_keep: logits of the last this many positions (0: all). output_hidden_states: also return
            transformers' ``hidden_states`` tuple (``L + 1`` tensors ``[B, m, H]``: the embeddings, each layer's
            output, the last one after the final norm). exact: attend through
            :func:`decode.attention.exact_sdpa` (the engine's target cache in exact mode).

    Returns:
        ``CausalLMOutputWithPast`` with ``logits [B, min(m, logits_to_keep) or m, V]``, ``cache`` (updated in place)
        and the hidden states where asked.
    """
    body, cfg = model.model, model.config
    h = body.embed_tokens(input_ids)
    cos, sin = body.rotary_emb(h, position_ids=position_ids)
    cos, sin = cos[:, None], sin[:, None]
    b, m, _ = h.shape
    mask = _mask(attention_mask, m)
    states = [h] if output_hidden_states else None
    for i, layer in enumerate(body.layers[: cfg.num_hidden_layers]):
        attn, mlp = layer.self_attn, layer.mlp
        x = _rms(h, layer.input_layernorm)
        d = attn.head_dim
        q = attn.q_proj.forward(x).view(b, m, -1, d)
        k = attn.k_proj.forward(x).view(b, m, -1, d)
        v = attn.v_proj.forward(x).view(b, m, -1, d).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotation
            q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
        q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        k, v = cache.update(k, v, i)
        h = h + attn.o_proj.forward(_attend(attn, q, k, v, mask, exact))
        x = _rms(h, layer.post_attention_layernorm)
        gate, up = mlp.gate_proj.forward(x), mlp.up_proj.forward(x)
        h = h + mlp.down_proj.forward(torch.nn.functional.silu(gate) * up)
        if states is not None:
            states.append(h)
    h = _rms(h, body.norm)
    if states is not None:
        states[-1] = h
    kept = h[:, -logits_to_keep:] if logits_to_keep else h
    return CausalLMOutputWithPast(logits=model.lm_head.forward(kept), **{CACHE_ARG: cache},
                                  hidden_states=tuple(states) if states is not None else None)
