"""Compiled target passes: the compact forward (:mod:`decode.compact`) through ``torch.compile``, weights frozen.

:class:`compiled_mode` (off by default) runs every pass of the target after its prefill (decoding steps,
verification passes of chains and trees) as one graph compiled by TorchInductor with its ``freezing`` option, as
gpt-fast and vLLM's CPU backend do: the weights become constants of the graph, the elementwise work of a layer
(RMSNorm, the rotary embedding, SiLU gating, residual adds) fuses into a few C++ kernels, and no Python runs per
layer. The LM head runs inside the graph. A bf16 pass of at most 16 rows (a decoding step, a chain's or a small
tree's verification pass, a drafting step) runs its linear layers through :mod:`decode.few_rows`' kernel
(:class:`Linear`) where the CPU has AVX-512 BF16 or AVX2: each weight read once whatever the row count. Elsewhere a
decoding step at batch 1 (one row) takes the faster, timed when its graph compiles (``max_autotune``), of inductor's
C++ GEMM template (generated for the CPU's vector units: AVX-512, AMX where present) and ATen's oneDNN call
(:data:`INDUCTOR_ONE_ROW`), and other passes oneDNN's (``docs/benchmarks/engine.md`` has what each buys). Drafters
compile their own passes through :func:`module_call` (EAGLE-family heads: ``drafters/heads/compiled_steps.py``;
DFlash and DSpark: ``drafters/block_pass.py``). Shapes are dynamic (``dynamic=True``): one graph serves every cache
length and pass size; a pass with an attention mask and one without (a decoding step that sees every column) are two
graphs, and a pass that returns hidden states (EAGLE-family drafters read them) two more. The cache's keys and
values live in buffers allocated for the whole decode (``RaggedCache``'s capacity) and each pass writes its new
columns into them in place, as gpt-fast's static cache does: no pass copies the cache's past, and a crop or a tree's
reordering leaves the layers' tensors views of the same buffers.

Cost: the first pass of each graph compiles it (with the GEMMs' timing where used), 10-110 s on 2 cores (inductor's
caches under ``TORCHINDUCTOR_CACHE_DIR`` keep the generated kernels for the next process, not dynamo's tracing);
:func:`decode.warm.warm_up` compiles every graph a batch-1 decode uses before anything is timed;
``docs/benchmarks/engine.md`` has the measured compile time and the decoding speed it buys. Memory: one more copy
of the decoder's weights and the LM head (the graph's constants). A model :func:`decode.compact.compact_problem`
refuses, exact mode (``decode.exact_mode``) and a compile that fails run the compact or transformers forward
instead; a failure says so once, on stderr, with the reason.

What it computes is :func:`decode.compact.compact_forward`'s arithmetic, reordered where inductor fuses it (fp32:
~1e-6 of the logits; bf16: an ulp here and there, so a greedy output may leave the eager one's at a near-tie, as
between any two engines); ``tests/test_decode_compiled.py`` compares the two on tiny models.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from contextlib import ExitStack

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from drafterkit.decode import attention, compact, few_rows, fused
from drafterkit.decode.compact import rms, rotate

#: ``decode.generate`` runs the target's passes compiled while True; set it with :class:`compiled_mode`
ENABLED = False

#: graphs ``torch.compile`` may build for one code object (dynamo's ``recompile_limit``, 8 by default)
RECOMPILES = 256

#: inductor's options for the passes of several rows (verification passes, batches): weights frozen into the graph,
#: the linear layers ATen's oneDNN calls on them
INDUCTOR = {"freezing": True}

#: and for a pass of one row (a decoding step at batch 1, a graph of its own: dynamo specializes sizes of 1): every
#: linear layer (the LM head's too) the faster of inductor's C++ GEMM template (generated for the CPU's vector units)
#: and ATen's call, timed when it compiles; the timings are not printed (they are inductor's notes). The template
#: reads a one-row GEMM's weights ~1.5x faster than oneDNN here, but costs ~2x at six rows, so it is one row's only
INDUCTOR_ONE_ROW = {**INDUCTOR, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                    "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}

#: model -> its compiled passes (None: compiling failed; the compact forward runs)
_compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: owner (a drafter) -> the compiled module of :func:`module_call` (None: compiling failed; the eager code runs)
_modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: a transformers cache -> its key and value buffers per layer (:func:`_buffers`)
_kv_buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class compiled_mode:  # noqa: N801 -- a switch used as a function and a context manager, as decode.exact_mode
    """Turn compiled target passes on (``enabled=True``) or off for the whole process (module docstring).

    Called plainly it is a setter; as a context manager it restores the mode found before on exit::

        with decode.compiled_mode():
            out = decode.generate(target, [ids], drafter=head, num_draft_tokens=5)

    Args:
        enabled: True to compile the target's passes (Llama-layout targets on a CPU, outside exact mode).
    """

    def __init__(self, enabled: bool = True) -> None:
        global ENABLED
        self.before = ENABLED
        ENABLED = bool(enabled)

    def __enter__(self) -> compiled_mode:
        return self

    def __exit__(self, *exc: object) -> None:
        global ENABLED
        ENABLED = self.before


def _weight(*linears: nn.Linear) -> tuple[nn.Parameter, nn.Parameter | None]:
    """The linear layers' weights (and biases) concatenated, as parameters of the graph's module (copies)."""
    w = torch.cat([lin.weight.detach() for lin in linears])
    b = torch.cat([lin.bias.detach() for lin in linears]) if linears[0].bias is not None else None
    return (nn.Parameter(w, requires_grad=False),
            nn.Parameter(b, requires_grad=False) if b is not None else None)


class Linear(nn.Module):
    """A linear layer of a compiled graph from its own copy of one or more layers' weights (concatenated: merged
    projections): ``x [..., in] -> [..., out]``. A bf16 pass of at most :data:`decode.few_rows.ROWS` rows (a decoding
    step, a chain's verification pass, a drafting step) runs :func:`decode.few_rows.linear` on a packed copy where
    that kernel runs (:func:`decode.few_rows.available`), every other pass ATen's ``linear``."""

    def __init__(self, *linears: nn.Linear):
        super().__init__()
        self.weight, self.bias = _weight(*linears)
        w = self.weight
        self.packed = nn.Parameter(few_rows.pack(w.detach()), requires_grad=False) if few_rows.fits(w) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.numel() <= few_rows.ROWS * x.shape[-1]:
            return few_rows.linear(x, self.packed, self.bias, self.weight.shape[0])
        return torch.nn.functional.linear(x, self.weight, self.bias)


def few_row_linears(module: nn.Module) -> nn.Module:
    """``module`` with each plain ``nn.Linear`` inside replaced by a :class:`Linear` of its weights, in place (for a
    copy a compiled graph runs: ``drafters/heads/compiled_steps.py``); returns it."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and not child._forward_hooks and not child._forward_pre_hooks:
                setattr(parent, name, Linear(child))
    return module


class _Layer(nn.Module):
    """One decoder layer's weights: merged q/k/v and gate/up projections, norms (Qwen3's q/k norms too)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = Linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = Linear(attn.o_proj)
        self.gate_up = Linear(mlp.gate_proj, mlp.up_proj)
        self.down = Linear(mlp.down_proj)
        self.ln1 = nn.Parameter(layer.input_layernorm.weight.detach().clone(), requires_grad=False)
        self.ln2 = nn.Parameter(layer.post_attention_layernorm.weight.detach().clone(), requires_grad=False)
        norms = hasattr(attn, "q_norm")
        self.q_norm = nn.Parameter(attn.q_norm.weight.detach().clone(), requires_grad=False) if norms else None
        self.k_norm = nn.Parameter(attn.k_norm.weight.detach().clone(), requires_grad=False) if norms else None
        self.eps, self.head_eps = layer.input_layernorm.variance_epsilon, getattr(
            getattr(attn, "q_norm", None), "variance_epsilon", 0.0)
        self.heads, self.kv_heads = attn.q_proj.out_features // attn.head_dim, attn.k_proj.out_features // attn.head_dim
        self.head_dim, self.scaling, self.inter = attn.head_dim, attn.scaling, mlp.gate_proj.out_features


class _Passes(nn.Module):
    """The decoder layers and the final norm of one model as a module for ``torch.compile`` (its parameters are the
    graph's constants under inductor's ``freezing``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        body = model.model
        self.layers = nn.ModuleList(_Layer(layer) for layer in body.layers[: model.config.num_hidden_layers])
        self.norm = nn.Parameter(body.norm.weight.detach().clone(), requires_grad=False)
        self.eps = body.norm.variance_epsilon
        if type(model.lm_head) is not nn.Linear or compact._hooked(model.lm_head):  # its weight is not all it does
            raise TypeError("the LM head is not a plain nn.Linear without hooks")
        self.head = Linear(model.lm_head)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                keys: list[torch.Tensor], values: list[torch.Tensor], hidden: bool, keep: int):
        """``h [B, m, H]`` embeddings, ``cos, sin [B, 1, m, D]``, ``mask [B, 1, m, K]`` bool or None (every column
        up to each query's own), ``keys, values`` per layer ``[B, Hkv, K, D]``: views of the cache's buffers whose
        last ``m`` columns this pass fills in place (no copy of the cache's past), ``keep`` the logits of the last this
        many positions (0: all). Returns ``(logits [B, keep or m, V], hidden states or [])``."""
        b, m, _ = h.shape
        states = [h] if hidden else []
        for i, lay in enumerate(self.layers):
            d, hq, hkv = lay.head_dim, lay.heads, lay.kv_heads
            y = lay.qkv(rms(h, lay.ln1, lay.eps))
            q = y[..., : hq * d].view(b, m, hq, d)
            k = y[..., hq * d: (hq + hkv) * d].view(b, m, hkv, d)
            v = y[..., (hq + hkv) * d:].view(b, m, hkv, d).transpose(1, 2)
            if lay.q_norm is not None:
                q, k = rms(q, lay.q_norm, lay.head_eps), rms(k, lay.k_norm, lay.head_eps)
            q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
            start = keys[i].shape[2] - m
            keys[i][:, :, start:] = k
            values[i][:, :, start:] = v
            g = hq // hkv  # the g query heads of a group as g * m rows against their key/value head
            qg = q.reshape(b, hkv, g * m, d)
            mg = mask.repeat(1, 1, g, 1) if mask is not None else None
            out = torch.nn.functional.scaled_dot_product_attention(qg, keys[i], values[i], attn_mask=mg,
                                                                   scale=lay.scaling)
            out = out.reshape(b, hq, m, d).transpose(1, 2).reshape(b, m, hq * d)
            h = h + lay.o(out)
            gu = lay.gate_up(rms(h, lay.ln2, lay.eps))
            h = h + lay.down(torch.nn.functional.silu(gu[..., : lay.inter]) * gu[..., lay.inter:])
            if hidden:
                states.append(h)
        h = rms(h, self.norm, self.eps)
        if hidden:
            states[-1] = h
        kept = h[:, -keep:] if keep else h
        return self.head(kept), states


def _passes(model: nn.Module):
    """``model``'s compiled passes, built on first use; None where building them failed (said once)."""
    if model in _compiled:
        return _compiled[model]
    try:
        fn = torch.compile(_Passes(model).eval(), dynamic=True, fullgraph=True)
    except Exception as exc:  # noqa: BLE001 -- any failure to build falls back to the eager forward, said once
        _fail(model, exc)
        return None
    _compiled[model] = fn
    return fn


def _fail(model: nn.Module, exc: BaseException, table: weakref.WeakKeyDictionary = _compiled) -> None:
    table[model] = None
    print(f"drafterkit: compiled passes are off for {type(model).__name__} ({type(exc).__name__}: "
          f"{str(exc).splitlines()[0] if str(exc) else ''}); its passes run uncompiled", file=sys.stderr)


def _options(one_row: bool, dtype: torch.dtype):
    """The patches every compiled call runs under: inductor's options (:data:`INDUCTOR_ONE_ROW` for one row unless
    its linear layers run :mod:`decode.few_rows`' kernel), dynamo's recompile limit and no duck shapes (sizes equal at
    trace time stay distinct symbols)."""
    timed = one_row and not (dtype == torch.bfloat16 and few_rows.available())
    stack = ExitStack()
    stack.enter_context(torch._inductor.config.patch(INDUCTOR_ONE_ROW if timed else INDUCTOR))
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=RECOMPILES))
    stack.enter_context(torch.fx.experimental._config.patch(use_duck_shape=False))
    return stack


def module_call(owner: nn.Module, make: Callable[[], nn.Module], *args, one_row: bool = False):
    """``make()``'s module called on ``args`` compiled (built on first use for ``owner`` and kept while it lives), or
    ``None`` where it does not run compiled: compiled mode off, exact mode (``decode.exact_mode``), or building or
    compiling it failed (said once, on stderr; the caller's eager code runs). Drafters run their drafting passes
    through it (``drafters/heads/compiled_steps.py``); ``one_row``: the call is one row (a drafting step at batch 1),
    whose linear layers get :data:`INDUCTOR_ONE_ROW`'s timed GEMM choice. ``args`` are handed over through
    :func:`standard`, so a view and a new tensor of the same shape reuse one graph.

    ``make()``'s module should hold a copy of ``owner``'s weights (its graph freezes them as constants):
    :func:`runs_compiled`, which a decode asks once before it starts, drops it when ``owner``'s weights changed.
    """
    if not may_call(owner):
        return None
    if owner not in _modules:
        try:
            _modules[owner] = (fused.stamp(_state_tensors(owner)),
                               torch.compile(make().eval(), dynamic=True, fullgraph=True))
        except Exception as exc:  # noqa: BLE001 -- any failure to build falls back to the eager code, said once
            _fail(owner, exc, _modules)
    if _modules[owner] is None:
        return None
    try:
        with _options(one_row, next(owner.parameters()).dtype):
            return _modules[owner][1](*standard(args))
    except Exception as exc:  # noqa: BLE001 -- a graph that does not compile: the eager code, said once
        _fail(owner, exc, _modules)
        return None


def may_call(owner: nn.Module) -> bool:
    """Whether :func:`module_call` would run ``owner``'s module compiled now (compiled mode on, not exact mode, no
    failed compile for it), before anything is built."""
    return ENABLED and not attention.EXACT and _modules.get(owner, True) is not None


def drafts_compiled(owner: nn.Module, device: torch.device) -> bool:
    """Whether a drafter ``owner`` drafts through :func:`module_call` now on ``device``: it declares
    ``compiled_steps``, ``device`` is a CPU and :func:`may_call` says yes (the question every compiled drafting path
    asks before it builds its inputs)."""
    return device.type == "cpu" and getattr(owner, "compiled_steps", False) and may_call(owner)


def standard(value):
    """``value`` with every tensor in it (nested in tuples and lists) laid out with a new tensor's strides (a copy
    where a view's differ: a cache cut back after rejected drafts, one row of a wider output) and every list a tuple.
    A compiled graph guards its inputs' strides, size-1 dimensions' too, and their container types: inputs of one
    layout reuse the graphs a warm-up built instead of compiling new ones inside a timed decode."""
    if isinstance(value, torch.Tensor):
        expected, step = [], 1
        for size in reversed(value.shape):
            expected.append(step)
            step *= max(size, 1)
        return value if value.stride() == tuple(reversed(expected)) else value.clone(
            memory_format=torch.contiguous_format)
    if isinstance(value, (tuple, list)):
        return tuple(standard(v) for v in value)
    return value


def _state_tensors(module: nn.Module) -> list[torch.Tensor]:
    """What a compiled copy of ``module`` freezes: its parameters, then its buffers (EAGLE-3's draft-id map)."""
    return [*module.parameters(), *module.buffers()]


def runs_compiled(module: object) -> bool:
    """Whether ``module`` (a drafter) runs its drafting passes through :func:`module_call` in a decode starting now:
    compiled mode on, not exact mode, it declares ``compiled_steps`` true, its parameters are on a CPU, and its
    compile has not failed. A module built from weights or buffers changed since (:func:`decode.fused.intact`) is
    dropped; the next call builds it again."""
    if not (ENABLED and not attention.EXACT and getattr(module, "compiled_steps", False)):
        return False
    tensors = _state_tensors(module) if isinstance(module, nn.Module) else []
    if not tensors or tensors[0].device.type != "cpu":
        return False
    built = _modules.get(module, ())
    if built and not fused.intact(tensors, built[0]):
        del _modules[module]
    return built is not None


def _buffers(cache, layers: list, need: int, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, key and value buffers ``[B, Hkv, C, D]`` (``C >= need``) whose first columns the layer's tensors
    are views of: the ones kept for ``cache`` when they still are (crops, a tree's in-place reordering), else new
    ones of ``max(capacity, 2 * need)`` columns holding the layer's columns (after a prefill, or when full). The
    views' strides stay those of the buffer, so a pass compiles once for every cache length."""
    kept = _kv_buffers.get(cache)
    if kept is not None and kept[0][0].shape[2] >= need and all(
            la.keys.data_ptr() == kb.data_ptr() and la.values.data_ptr() == vb.data_ptr()
            and la.keys.stride() == kb.stride() for la, kb, vb in zip(layers, *kept)):
        return kept
    n = max(capacity, 2 * need)
    kept = ([], [])
    for la in layers:
        for old, out in ((la.keys, kept[0]), (la.values, kept[1])):
            buf = old.new_empty(*old.shape[:2], n, old.shape[3])
            buf[:, :, : old.shape[2]] = old
            out.append(buf)
    _kv_buffers[cache] = kept
    return kept


def compiled_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     position_ids: torch.Tensor, cache, logits_to_keep: int = 0,
                     output_hidden_states: bool = False, capacity: int = 0) -> CausalLMOutputWithPast | None:
    """:func:`decode.compact.compact_forward` through the model's compiled passes, or None where they cannot run
    (the cache holds no columns yet: a prefill runs eager; building or compiling failed). Same arguments and
    result; the cache's key/value tensors become views of buffers of at least ``capacity`` columns that later
    passes write into in place (:func:`_buffers`)."""
    layers = getattr(cache, "layers", [])
    if not layers or not getattr(layers[0], "is_initialized", False) or (fn := _passes(model)) is None:
        return None
    body = model.model
    h = body.embed_tokens(input_ids)
    cos, sin = body.rotary_emb(h, position_ids=position_ids)
    mask = compact._mask(attention_mask, input_ids.shape[1])
    if mask is not None and mask.dtype != torch.bool:  # an additive float mask: 0 where a key is seen
        mask = mask == 0
    m = input_ids.shape[1]
    need = layers[0].keys.shape[2] + m
    key_bufs, value_bufs = _buffers(cache, layers, need, capacity)
    keys, values = [kb[:, :, :need] for kb in key_bufs], [vb[:, :, :need] for vb in value_bufs]
    try:
        # every (batch 1 or more) x (1 token or more) x (mask or none) x (hidden states or not) is its own graph
        # (dynamo specializes sizes 0 and 1), over every model compiled in the process: the limit counts them all
        # no duck shapes: sizes equal at trace time (a pass's g * m rows and the cache's length) stay distinct symbols
        with _options(input_ids.shape[0] == 1 and m == 1, h.dtype):
            logits, states = fn(h, cos[:, None], sin[:, None], mask, keys, values, bool(output_hidden_states),
                                min(int(logits_to_keep), m))
    except Exception as exc:  # noqa: BLE001 -- a graph that does not compile: the eager forward, said once
        _fail(model, exc)
        return None
    for layer, k, v in zip(layers, keys, values):
        layer.keys, layer.values = k, v
    return CausalLMOutputWithPast(logits=logits, **{compact.CACHE_ARG: cache},
                                  hidden_states=tuple(states) if output_hidden_states else None)


