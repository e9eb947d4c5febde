"""One GEMM for the projections that read the same input: q/k/v in attention, gate/up in the MLP.

At decoding batch sizes (one row, or the few nodes of a verification pass) a transformers decoder layer
on a CPU spends much of its time in per-call overhead: SmolLM2-135M runs 7 ``linear`` calls per layer.
vLLM loads such targets with merged projection weights (``QKVParallelLinear``,
``MergedColumnParallelLinear``); :func:`fused_projections` does the same for a transformers model
without changing its code. For each module whose children ``q_proj, k_proj, v_proj`` (or
``gate_proj, up_proj``) are plain ``nn.Linear`` layers over the same input, their weights are moved
once into one ``[sum of out_features, in_features]`` tensor and each layer's ``weight`` becomes a row
slice of it (a view: no extra memory, identical values, so transformers' own code, ``save_pretrained``
and ``generate`` see the same parameters). Inside the context the first layer of a group called on an
input computes the whole group's output with one GEMM and the others return their column slices of it.

Measured on this project's 2-core CPU (bf16, SmolLM2-135M, one decoder layer's projections): 445 ->
354 us per layer at 1 row, 494 -> 434 us at 6 rows; outputs bit-identical to the separate GEMMs in
fp32 and bf16 at 1-200 rows (BENCHMARKS.md, session 9; tests/test_decode_fused.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

#: sibling ``nn.Linear`` children that read the same input in transformers' decoder layers
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Group:
    """The merged weight (and bias) of one group and the last input it was called on."""

    def __init__(self, layers: list[nn.Linear]):
        self.layers = layers
        self.sizes = [lin.out_features for lin in layers]
        self.weight = torch.cat([lin.weight.detach() for lin in layers])
        self.bias = (torch.cat([lin.bias.detach() for lin in layers]) if layers[0].bias is not None else None)
        start = 0
        for lin, n in zip(layers, self.sizes):  # each layer's parameters become views of the merged ones
            lin.weight.data = self.weight[start: start + n]
            if self.bias is not None:
                lin.bias.data = self.bias[start: start + n]
            start += n
        self.pointers = [lin.weight.data_ptr() for lin in layers]
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def intact(self) -> bool:
        """Whether every layer's weight is still the view made at construction (not reassigned)."""
        return all(lin.weight.data_ptr() == p and lin.weight.dtype == self.weight.dtype
                   for lin, p in zip(self.layers, self.pointers))

    def forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if x is not self.input:  # holding ``input`` keeps its id from being reused by another tensor
            self.input = x
            self.outputs = torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, -1)
        return self.outputs[i]

    def clear(self) -> None:
        self.input, self.outputs = None, ()


def _mergeable(layers: list) -> bool:
    if not all(type(lin) is nn.Linear for lin in layers):  # LoRA, quantized or hooked layers stay as they are
        return False
    w0 = layers[0].weight
    return (all(lin.in_features == layers[0].in_features and lin.weight.dtype == w0.dtype
                and lin.weight.device == w0.device and (lin.bias is None) == (layers[0].bias is None)
                and not lin._forward_hooks and not lin._forward_pre_hooks for lin in layers))


_groups: "weakref.WeakKeyDictionary[nn.Module, list[_Group]]" = weakref.WeakKeyDictionary()


def merged_groups(model: nn.Module) -> list[_Group]:
    """The model's mergeable projection groups, merged on first call (and again for any group whose
    weights were reassigned since, e.g. by ``load_state_dict`` with ``assign=True``)."""
    groups = _groups.get(model)
    if groups is not None and all(g.intact() for g in groups):
        return groups
    groups = []
    with torch.inference_mode(False), torch.no_grad():  # normal tensors even when called under inference mode
        for module in model.modules():
            for names in GROUPS:
                layers = [getattr(module, n, None) for n in names]
                if all(isinstance(lin, nn.Linear) for lin in layers) and _mergeable(layers):
                    groups.append(_Group(layers))
    _groups[model] = groups
    return groups


@contextmanager
def fused_projections(model: nn.Module) -> Iterator[None]:
    """Inside the block, each merged group of ``model`` (:func:`merged_groups`) runs one GEMM per input.

    ``decode.generate`` holds it around a whole decode (the target's passes and any drafter that
    shares the target's layers), so transformers' ``generate`` on the same model, outside it, runs
    the stock ``nn.Linear`` calls (on the same values, now views of the merged weights).

    Outputs are those of the separate layers (the same rows of the same weights); the returned
    tensors are column slices of the merged output (non-contiguous, as transformers' ``view`` to
    heads accepts). Models without such groups (GPT-2's fused ``c_attn``, Phi-3's ``qkv_proj``) run
    unchanged. Not re-entrant for the same model. Training code should not use it: the merged
    weight does not carry gradients back to the layers' parameters.
    """
    groups = merged_groups(model)
    if not groups:
        yield
        return
    for g in groups:
        for i, lin in enumerate(g.layers):
            lin.forward = (lambda x, _g=g, _i=i: _g.forward(_i, x))
    try:
        yield
    finally:
        for g in groups:
            g.clear()
            for lin in g.layers:
                del lin.forward
