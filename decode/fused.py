"""The decoder's CPU linear layers: merged projections, bf16 weights prepacked for oneDNN (or run through the few-row
kernel where oneDNN has no bf16 GEMM), few-row fp32 GEMMs.

At decoding batch sizes (one row, or the few nodes of a verification pass) a transformers decoder on a
CPU spends its time in ``linear`` calls that are small and many: SmolLM2-135M makes 7 per layer, 211
per forward. Two things make them cheaper, both as inference engines do it:

* **Merged projections.** ``q_proj, k_proj, v_proj`` (and ``gate_proj, up_proj``) read the same input;
  one GEMM over their concatenated weights replaces three (two) calls, as vLLM's ``QKVParallelLinear``
  / ``MergedColumnParallelLinear`` load them.
* **Prepacked bf16 weights.** PyTorch's CPU ``linear`` in bf16 runs oneDNN, which reorders the weight
  into its blocked layout on every call; PyTorch's own compiler does that reorder once when it freezes
  a model (``torch.ops.mkldnn._reorder_linear_weight`` + ``_linear_pointwise``). Same kernel, same
  results (checked bit for bit when a weight is packed; a mismatch or a missing op falls back to the
  plain merged weight), without the per-call reorder.
* **The few-row kernel where oneDNN has no bf16 GEMM.** On a CPU with AVX2 only, oneDNN refuses to prepack bf16
  and PyTorch's bf16 GEMM is a slow generic loop (1.4-1.7x the kernel at one row, 4-5x from 6 rows). There bf16
  layers run :mod:`decode.few_rows`' kernel in calls of up to 16 rows, and past :data:`KERNEL_MAX_ROWS` rows (a
  prefill) one fp32 GEMM (:func:`_kernel_matmul`): PyTorch's values up to an ulp, not its bits.

Measured on this project's 2-core CPU (``benchmarks/engine_kernels.py``; BENCHMARKS.md, "Engine vs
transformers `generate`"): bf16 LM head 49152x576 3.2 -> 2.0 ms at 1 row and 4.7 -> 1.6 ms at 6; the
merged gate/up projection 3072x576 101 -> 47 us at 1 row. In fp32 (prepacked fp32 GEMMs do not give the
stock path's bits, so none is used) every linear layer of a pass of at most :data:`FEW_ROWS` rows (a
decoding step, a verification pass) computes ``weight @ input^T`` (:func:`_few_rows`): the stock
``input @ weight^T`` takes a small-M path that costs 2-3x the one-row product for 2-4 rows on an AVX2
CPU. One row gives the stock bits; several rows the stock values up to fp32 rounding (~1e-6).

:func:`fused_projections` holds them for one decode: ``decode.generate`` wraps the target (and the
drafter's own modules) in it. The engine computes from its OWN copies of the weights (built once per
model and kept while it lives: one more copy of the linear weights in memory), so the model's
parameters are never touched and transformers' ``generate`` on the same model, outside the block, runs
its stock code. Off the CPU nothing changes. Copies are rebuilt when the weights change: each decode
compares every weight's address, version counter and values at 256 seeded positions with those it
was built from (~2 ms for the default target); only an in-place edit of a few elements that bypasses
autograd (``w.data[i, j] = x``) can go unseen, for which :func:`refresh` exists. Decodes in several
threads over one model are safe (each thread keeps its own last input and outputs).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from drafterkit.decode import attention, few_rows, invariance

#: inputs of more rows (batch x tokens) than this run the stock layers. SmolLM2-135M body, bf16, this
#: project's CPU: 1 row 31.8 -> 21.7 ms, 6 rows 36.1 -> 22.7, 48 rows 79.7 -> 62.8, 200 rows 202 -> 196,
#: but 4 x 256 rows 746 -> 876 ms (the merged outputs' column-slice layout slows what follows)
MAX_ROWS = 256

#: weight values sampled per tensor to notice edits that bypass PyTorch's version counter
SAMPLES = 256

#: bf16 / fp16 rows are computed in GEMM calls of fixed row counts (``decode.invariance``), so a row gets the
#: same bits in a decoding step, a verification pass and a prefill, alone or in a batch; set it with
#: ``decode.exact_mode`` (off by default)
ROW_INVARIANT = False

#: set to ``False`` to run the stock layers everywhere (``benchmarks/engine_kernels.py`` compares both)
ENABLED = True

#: sibling ``nn.Linear`` children that read the same input in transformers' decoder layers
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``weight`` reordered for oneDNN, or ``None`` when that op is missing or gives different bits."""
    if weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        probe = torch.randn(2, 3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        same = torch.equal(torch.ops.mkldnn._linear_pointwise(probe, packed, bias, "none", [], ""),
                           torch.nn.functional.linear(probe, weight, bias))
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return packed if same else None


#: fp32 inputs of at most this many rows compute ``(W @ x^T)^T`` (:func:`_few_rows`)
FEW_ROWS = 8


def _few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear(x, weight, bias)`` for a few fp32 rows as ``weight @ x^T``: the weight is the GEMM's
    left-hand side, which on an AVX2 CPU reads it once in a kernel made for that shape, where the
    stock ``x @ weight^T`` takes a small-M path that costs 2-3x the one-row product for 2-4 rows
    (SmolLM2-135M's linear layers, 2 threads: 2 rows 86 -> 42 ms, 4 rows 84 -> 39 ms; one row is
    unchanged and gives the stock bits).

    The product ``weight @ x^T`` is ``[out, rows]``; its transpose is copied to a row-major ``[rows, out]``
    (``rows x out`` values, a small fraction of the GEMM's ``out x in`` weight reads; one row needs no copy) so
    the output has the stock layout, a last dimension of stride 1: left transposed, its last dimension's stride
    is ``rows``, and a model that reinterprets it through ``torch.view_as_complex`` (Llama-4's and DeepSeek-V2's
    rotary embedding, whose ``.float()`` copies only a bf16 tensor) fails with "Tensor must have a last
    dimension with stride 1"."""
    flat = x.reshape(-1, x.shape[-1])
    y = torch.mm(weight, flat.t()).t().contiguous()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


#: bf16 inputs of more rows than this, on a layer that runs the few-row kernel, take one fp32 GEMM instead (bf16
#: cast up, the result rounded back): on a 2-core AVX2 CPU one SmolLM2-135M layer's GEMMs cost 3.7 / 6.8 ms at 32 /
#: 64 rows in the kernel's 16-row calls, 5.8 / 6.4 in the fp32 GEMM and 15.1 / 28.9 in PyTorch's bf16 GEMM
#: (``benchmarks/few_rows_gemm.py --prefill``, docs/benchmarks/engine.md)
KERNEL_MAX_ROWS = 48


def _kernel_matmul(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """``linear(x, weight, bias)`` in bf16 through :mod:`decode.few_rows`' kernel (``packed``: its copy of ``weight``),
    in calls of at most :data:`decode.few_rows.ROWS` rows; past :data:`KERNEL_MAX_ROWS` rows one fp32 GEMM. Both sum
    in fp32 and round once to bf16, so the values are PyTorch's bf16 GEMM's up to an ulp, not its bits; each row's
    bits depend on its own values and on which of the two ran (exact mode's check finds the row counts that agree)."""
    rows = x.reshape(-1, x.shape[-1])
    n, m = weight.shape[0], rows.shape[0]
    if m > KERNEL_MAX_ROWS:
        y = torch.nn.functional.linear(rows.float(), weight.float(), None if bias is None else bias.float())
        y = y.to(torch.bfloat16)
    elif m <= few_rows.ROWS:
        y = few_rows.linear(rows, packed, bias, n)
    else:
        y = torch.cat([few_rows.linear(rows[i: i + few_rows.ROWS], packed, bias, n)
                       for i in range(0, m, few_rows.ROWS)])
    return y.reshape(*x.shape[:-1], n)


def stamp(tensors: list[torch.Tensor]) -> list[tuple]:
    """Per tensor: its address, its in-place version counter and :data:`SAMPLES` of its values at fixed seeded
    positions (edits through ``.data``, fused optimizers and peft's ``merge_adapter`` change values without bumping
    the counter). :func:`intact` compares tensors with it."""
    out = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        g = torch.Generator().manual_seed(flat.numel())
        idx = torch.randint(0, flat.numel(), (min(SAMPLES, flat.numel()),), generator=g)
        out.append((t.data_ptr(), t._version, idx, flat.index_select(0, idx)))
    return out


def intact(tensors: list[torch.Tensor], stamped: list[tuple]) -> bool:
    """Whether ``tensors`` are those :func:`stamp` saw, unchanged: same tensors, same version counters and the same
    values at the sampled positions."""
    if len(tensors) != len(stamped):
        return False
    for t, (ptr, version, idx, values) in zip(tensors, stamped):
        if t.data_ptr() != ptr or t._version != version:
            return False
        if not torch.equal(t.detach().reshape(-1).index_select(0, idx), values):
            return False
    return True


class _Group:
    """The engine's copy of one group of linear layers (merged; prepacked where it gives the same bits)
    and, per thread, the last input it was called on and its outputs."""

    def __init__(self, layers: list[nn.Linear]):
        self.layers = layers
        self.sizes = [lin.out_features for lin in layers]
        self.stamp = stamp(self._tensors())
        # one layer: its own weight (no copy); several: their concatenation
        weight = torch.cat([lin.weight.detach() for lin in layers]) if len(layers) > 1 else layers[0].weight.detach()
        bias = self.bias = torch.cat([lin.bias.detach() for lin in layers]) if layers[0].bias is not None else None
        self.packed = _pack(weight, bias)
        self.weight = None if self.packed is not None else weight  # the packed copy replaces the plain one
        # bf16 weights oneDNN cannot prepack (a CPU without its bf16 GEMM: AVX2 only) run the few-row kernel
        self.kernel = few_rows.pack(weight) if self.packed is None and few_rows.fits(weight) else None
        self._local = threading.local()  # the last input and outputs, per thread

    def _tensors(self) -> list[torch.Tensor]:
        return [t.detach() for lin in self.layers for t in (lin.weight, lin.bias) if t is not None]

    def intact(self) -> bool:
        """Whether every layer still holds the same weights (:func:`intact`). A few elements changed without a
        version bump (``weight.data[i, j] = x``) can go unseen: :func:`refresh` after such edits."""
        return intact(self._tensors(), self.stamp)

    def hooked(self) -> bool:
        """Whether a layer got hooks (or was replaced) since the copy was built: it runs its own forward."""
        return not all(_plain(lin) for lin in self.layers)

    def forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        invariant = ROW_INVARIANT and x.dtype in (torch.bfloat16, torch.float16)
        if not invariant and self.kernel is None and x.numel() > MAX_ROWS * x.shape[-1]:  # a prefill (MAX_ROWS)
            lin = self.layers[i]
            return torch.nn.functional.linear(x, lin.weight, lin.bias)
        local = self._local
        if x is not getattr(local, "input", None):  # holding ``input`` keeps its id from being reused
            local.input = x
            y = self._invariant(x) if invariant else self._matmul(x)
            local.outputs = y.split(self.sizes, -1) if len(self.sizes) > 1 else (y,)
        return local.outputs[i]

    def _invariant(self, x: torch.Tensor) -> torch.Tensor:
        """``_matmul(x)`` with each row's bits independent of the row count (``decode.invariance``): calls of the
        row counts this layer's check allows, whatever pass the rows belong to."""
        rows = x.reshape(-1, x.shape[-1])  # a 1-D input (e.g. a learned [H] vector) is one row too
        key = (("prepacked",) * (self.packed is not None) + ("few-row kernel",) * (self.kernel is not None)
               + ("bias",) * (self.bias is not None))
        found = invariance.check(key, self._matmul, rows.shape[-1], sum(self.sizes), rows.dtype, rows.device)
        return invariance.run(self._matmul, rows, found.shapes).reshape(*x.shape[:-1], -1)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.kernel is not None:
            return _kernel_matmul(x, self.kernel, self.weight, self.bias)
        if self.weight.dtype == torch.float32 and x.numel() <= FEW_ROWS * x.shape[-1]:
            return _few_rows(x, self.weight, self.bias)
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def clear(self) -> None:
        self._local.input, self._local.outputs = None, ()


def _plain(lin) -> bool:
    # LoRA, quantized or hooked layers keep their own forward
    return type(lin) is nn.Linear and not lin._forward_hooks and not lin._forward_pre_hooks


def _build(model: nn.Module) -> list[_Group]:
    groups, grouped = [], set()
    for module in model.modules():
        for names in GROUPS:
            layers = [getattr(module, n, None) for n in names]
            if not all(_plain(lin) for lin in layers):
                continue
            w0, b0 = layers[0].weight, layers[0].bias
            if all(lin.in_features == layers[0].in_features and lin.weight.dtype == w0.dtype
                   and lin.weight.device == w0.device and (lin.bias is None) == (b0 is None) for lin in layers):
                groups.append(_Group(layers))
                grouped.update(id(lin) for lin in layers)
    # the other layers gain from packing (bf16) and from _few_rows (fp32); in bf16 / fp16 exact mode needs
    # every linear layer's rows computed in decode.invariance's calls of fixed row counts
    for lin in model.modules():
        if _plain(lin) and id(lin) not in grouped and lin.weight.dtype in (torch.bfloat16, torch.float16,
                                                                            torch.float32):
            groups.append(_Group([lin]))
            grouped.add(id(lin))
    return groups


_groups: weakref.WeakKeyDictionary[nn.Module, list[_Group]] = weakref.WeakKeyDictionary()


def engine_groups(model: nn.Module) -> list[_Group]:
    """The engine's copies of ``model``'s linear layers (:class:`_Group`), built on first call and again
    when a layer's weights were replaced or changed since (:meth:`_Group.intact`: a training step between
    two evaluations, ``load_state_dict``, peft's ``merge_adapter``); empty for a model off the CPU."""
    groups = _groups.get(model)
    if groups is not None and all(g.intact() for g in groups):
        return groups
    _groups.pop(model, None)  # free the stale copies before building new ones
    params = next(model.parameters(), None)
    if params is None or params.device.type != "cpu":
        groups = []
    else:
        with torch.inference_mode(False), torch.no_grad():  # plain tensors even under inference mode
            groups = _build(model)
    _groups[model] = groups
    return groups


def refresh(model: nn.Module) -> None:
    """Drop the engine's copies of ``model``'s weights; the next decode builds them anew. Needed only
    after editing a few weight elements in place without autograd seeing it (``w.data[i] = x``):
    replaced tensors, version-counted in-place updates and edits that touch many values (optimizer
    steps, fused or not, peft's ``merge_adapter``, scaling) are noticed by :func:`engine_groups`."""
    _groups.pop(model, None)


@contextmanager
def fused_projections(*models: nn.Module | None) -> Iterator[None]:
    """Inside the block, the linear layers of ``models`` with an engine copy (:func:`engine_groups`)
    compute from it: one GEMM per merged group and input, prepacked in bf16. Outputs are the same as the
    stock layers' (the merged outputs' column slices are returned, non-contiguous, as transformers'
    ``view`` to heads accepts). ``None`` entries and models without such layers are skipped, and a
    layer two models share (a drafter built on the target's layers) runs the first model's copy. Not
    re-entrant; no gradients flow through it (inference only)."""
    with ExitStack() as stack:
        for model in models:
            if model is not None and ENABLED:
                stack.enter_context(_installed(engine_groups(model)))
        yield


@contextmanager
def _installed(groups: list[_Group]) -> Iterator[None]:
    # not installed already (a layer two models share; another thread's decode), not hooked since built
    mine = [g for g in groups if not g.hooked() and not any("forward" in lin.__dict__ for lin in g.layers)]
    for g in mine:
        for i, lin in enumerate(g.layers):
            lin.forward = (lambda x, _g=g, _i=i: _g.forward(_i, x))
    try:
        yield
    finally:
        for g in mine:
            g.clear()
            for lin in g.layers:
                lin.__dict__.pop("forward", None)


def bitwise_exact(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether greedy speculative decoding through ``decode.generate`` equals greedy plain decoding token for
    token for a target in ``dtype`` on ``device``, bit for bit and not only up to near-ties: fp32 anywhere (its
    rounding differences stay far below a logit gap), and bf16 / fp16 on a CPU while the decoder's exact mode
    (``decode.exact_mode``: exact attention, linear layers in calls of fixed row counts, :data:`ROW_INVARIANT`) and
    its linear layers (:data:`ENABLED`) are on, unless a checked GEMM gave a row other bits at another place
    in a call or for the same call (``decode.invariance.holds``). Off the CPU in bf16 / fp16 a GEMM's rounding
    may depend on its row count (not controlled there), so a greedy output may leave plain decoding at a
    near-tie."""
    if dtype == torch.float32:
        return True
    return (torch.device(device).type == "cpu" and dtype in (torch.bfloat16, torch.float16) and attention.EXACT
            and ENABLED and ROW_INVARIANT and invariance.holds())
