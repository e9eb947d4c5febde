"""A feature head's drafting pass compiled (``decode.compiled_mode``): the head over new positions and the draft logits
of its outputs, one graph per shape (:func:`head_pass`).

The head's layers, its feature projection and its LM head run as one graph compiled by TorchInductor with its
``freezing`` option (:func:`decode.compiled.module_call`): no Python per layer, the elementwise work fused, and a
drafting step of one row (a chain at batch 1) takes the faster, timed when it compiles, of inductor's C++ GEMM
template and oneDNN's call for each linear layer, as the target's decoding step does (``decode/compiled.py``). The
graph computes from a copy of the head's weights (its constants), made when it is built; a decode that starts after
the head's weights changed (a training step between two evaluations) builds it again
(:func:`decode.compiled.runs_compiled`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from drafterkit.decode import compiled
from drafterkit.drafters.heads.layers import causal_mask


class HeadPass(nn.Module):
    """A copy of a feature head (``drafters.heads.feature_head.FeatureHeadDrafter``) whose forward is one drafting
    pass; see :func:`head_pass` for the arguments."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = copy.deepcopy(head)
        for module in self.head.modules():  # the engine's per-decode layer swaps (decode.fused) are not copied
            module.__dict__.pop("forward", None)
        compiled.few_row_linears(self.head)  # a few rows' bf16 GEMMs through decode.few_rows' kernel
        self.head.reset(0)
        device = next(self.head.parameters()).device
        for module in self.head.modules():  # RoPE's inverse frequencies made now, not by the graph's first call
            if getattr(module, "_inv_freq", False) is None:
                module.rope(torch.zeros(1, 1, dtype=torch.long, device=device), torch.float32)

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past,
                real: bool, keep: int):
        if real:
            hidden = self.head.real_input(hidden)
        out, kv = self.head._layer(ids, hidden, positions, mask, past)
        logits, _ = self.head.logits_and_ids(out[:, -keep:] if keep else out)
        return out, kv, logits


def head_pass(head: nn.Module, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
              past, real: bool, keep: int):
    """The head over ``m`` new positions and the draft logits of its last ``keep`` outputs (0: all), compiled; or
    ``None`` where it does not run compiled (:func:`decode.compiled.module_call`: compiled mode off, exact mode, off
    the CPU, a failed compile, said once), and the caller runs the head's eager code.

    Args:
        ids: ``[B, m]`` the token each position consumes. hidden: ``[B, m, F]`` target features when ``real``
            (the head's ``real_input`` maps them), else ``[B, m, H]`` head outputs. positions: ``[B, m]`` RoPE
            positions. mask: ``[m, S]`` or ``[B, 1, m, S]`` bool, True where a query may attend a key. past: per
            layer ``(k, v)`` ``[B, n_kv, S - m, d]``, or None.

    Returns:
        ``(out [B, m, H], per-layer (k, v) [B, n_kv, S, d], logits [B, keep or m, V'])``.
    """
    if ids.device.type != "cpu" or not ids.shape[1] or not getattr(head, "compiled_steps", False):
        return None
    return compiled.module_call(head, lambda: HeadPass(head), ids, hidden, positions, mask, past, bool(real),
                                int(keep), one_row=ids.shape[0] * ids.shape[1] == 1)


#: the drafting passes of a batch-1 decode of an EAGLE-family head, after a first catch-up (4 real positions, no
#: cache yet): later catch-ups of one and of several accepted positions, a chain's drafting step, tree levels of one
#: and of several nodes; each ``(positions, real, keep)`` as :func:`head_pass` takes them
CHAIN_AND_TREE = ((4, True, 1), (1, True, 1), (3, True, 1), (1, False, 1), (1, False, 0), (3, False, 0))


def warm_up(head: nn.Module, passes=CHAIN_AND_TREE) -> None:
    """Compile every graph a batch-1 decode of ``head`` uses (``decode.warm.warm_up_proposer`` calls it before
    anything is timed): ``passes`` of ``(positions, real, keep)``, the first without a cache, the others over the
    cache it left. Inputs are zeros of the decode's shapes."""
    p = next(head.parameters())
    hidden, width = head.config.hidden_size, len(head.feature_layers) * head.config.hidden_size

    def run(m: int, past, real: bool, keep: int):
        s = 0 if past is None else past[0][0].shape[2]
        ids = torch.ones(1, m, dtype=torch.long, device=p.device)
        feats = torch.zeros(1, m, width if real else hidden, dtype=head._dtype(), device=p.device)
        mask = causal_mask(m, s, p.device)
        return head._pass(ids, feats, torch.arange(s, s + m, device=p.device)[None], mask, past, real=real, keep=keep)

    with torch.inference_mode():
        _, past, _ = run(*passes[0][:1], None, *passes[0][1:])
        for m, real, keep in passes[1:]:
            run(m, past, real, keep)
