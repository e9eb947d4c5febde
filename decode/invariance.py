"""Row-count invariant linear layers for the decoder's exact mode: every GEMM call of one shape.

Greedy speculative decoding equals plain decoding token for token only if every committed token's logits get
the same bits whichever pass computed them: a plain step (one row per sequence), a verification pass (K + 1
rows, a tree's nodes, a ragged batch's rows), a prompt's prefill alone or in a batch. A CPU GEMM's rounding
depends on its row count M: the kernel, its blocking or its reduction order change with M, and with them an
output's last bit. Seen in bf16 (``benchmarks/exactness_replay.py``, docs/benchmarks/exactness.md):

* 2-core AMD EPYC (AVX512-BF16): oneDNN's one-row GEMM rounds apart from its several-row one (~1 output in
  6,000 at K = 1536);
* 2-core Intel Xeon with AMX: 1..32 rows agree; from 33 rows oneDNN runs its AMX kernel, whose rows differ from
  the small-M kernel's (every output of SmolLM2's LM head), so a ragged batch's prefill (one GEMM over all its
  prompts' tokens) left plain decoding of the same prompts alone.

So exact mode assumes nothing of how a kernel picks its path by M: :func:`run` computes every input in calls of
exactly :data:`CHUNK` rows (the last one zero-padded), so every call a layer makes has one shape, and each row's
bits can depend only on its own values and its place in a call. That last dependence is what :func:`check`
probes, once per layer shape and thread count: seeded rows run at two alignments (each row at positions ``p``
and ``p + CHUNK / 2``) must give the same bits, and the same call twice must too (a deterministic GEMM). A
shape that fails is recorded (:func:`holds` is False) with one warning: ``decode.fused.bitwise_exact`` then says
exactness is not guaranteed and an eval reports its texts' differences as unchecked, instead of claiming them.

Cost (SmolLM2-135M in bf16, all its linear layers, 1 thread, docs/benchmarks/exactness.md): a one-row step
run as 16 rows costs what the one-row GEMMs cost (memory-bound: the weights are read once either way); a
200-token prefill as 13 calls of 16 rows ~3x the stock one-call prefill (the AMX kernel is not used), a few
percent of a 128-token decode.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CHUNK", "Check", "check", "checks", "holds", "run"]

#: rows per GEMM call in exact mode: at least a chain's K + 1 and a small tree's nodes, so that a verification
#: pass is one call, and below the row counts where CPU GEMMs switch to their large-M kernels
CHUNK = 16

#: outputs compared per check (rows x out_features), at least 4 calls' worth of rows
CHECK_OUTPUTS = 1 << 16

_lock = threading.Lock()
_checks: dict[tuple, Check] = {}


@dataclass(frozen=True)
class Check:
    """What :func:`check` found for one layer shape.

    Attributes:
        position_invariant: each row got the same bits at two places in a :data:`CHUNK`-row call.
        deterministic: the same call gave the same bits twice.
        seconds: how long the check took (wall clock).
    """

    position_invariant: bool
    deterministic: bool
    seconds: float

    @property
    def holds(self) -> bool:
        return self.position_invariant and self.deterministic


def run(matmul: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``matmul(rows)`` computed in calls of exactly :data:`CHUNK` rows, the last zero-padded.

    Args:
        matmul: a linear layer's GEMM, ``[M, in] -> [M, out]``.
        rows: ``[M, in]``.

    Returns:
        ``[M, out]``; row ``i``'s bits come from a call of the same shape whatever ``M`` is.
    """
    n = rows.shape[0]
    pad = -n % CHUNK
    if pad:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))
    if n + pad == CHUNK:  # a decoding step or a verification pass: one call
        out = matmul(rows)
    else:
        out = torch.cat([matmul(rows[s: s + CHUNK]) for s in range(0, n + pad, CHUNK)])
    return out[:n] if pad else out


def _check(matmul: Callable[[torch.Tensor], torch.Tensor], in_features: int, out_features: int,
           dtype: torch.dtype, device: torch.device) -> Check:
    start = time.perf_counter()
    n = CHUNK * max(4, -(-CHECK_OUTPUTS // (CHUNK * out_features)))
    x = torch.randn(n, in_features, generator=torch.Generator().manual_seed(in_features)).to(device, dtype)
    first = run(matmul, x)
    half = CHUNK // 2  # the same rows, each half a call further on
    shifted = run(matmul, torch.cat([x.new_zeros(half, in_features), x]))[half:]
    return Check(torch.equal(first, shifted), torch.equal(run(matmul, x[:CHUNK]), first[:CHUNK]),
                 time.perf_counter() - start)


def check(key: tuple, matmul: Callable[[torch.Tensor], torch.Tensor], in_features: int, out_features: int,
          dtype: torch.dtype, device: torch.device) -> Check:
    """The :class:`Check` of the GEMM ``matmul`` (``[M, in_features] -> [M, out_features]``), run on first use
    and cached under ``key + (out_features, in_features, dtype, torch.get_num_threads())``.

    Args:
        key: what else selects the GEMM's kernel (prepacked weight, bias).
    """
    full = (out_features, in_features, dtype, torch.get_num_threads(), *key)
    found = _checks.get(full)
    if found is None:
        with _lock:
            found = _checks.get(full)
            if found is None:
                with torch.inference_mode():
                    found = _checks[full] = _check(matmul, in_features, out_features, dtype, device)
                if not found.holds:
                    what = "rows at another place in a call" if found.deterministic else "the same call twice"
                    warnings.warn(f"exact mode: the {str(dtype).removeprefix('torch.')} GEMM of a "
                                  f"{out_features}x{in_features} linear layer gave other bits for {what} on this "
                                  "CPU, so greedy speculative output is not guaranteed to equal plain decoding's "
                                  "(differences at near-ties are reported, not hidden); fp32 is exact",
                                  UserWarning, stacklevel=3)
    return found


def checks() -> dict[str, dict]:
    """Every check run in this process, for reports: ``{"bf16 576x1536, 2 threads": {"position_invariant",
    "deterministic", "seconds"}}`` (``out_features x in_features``)."""
    out = {}
    for (n_out, k, dtype, threads, *_), c in sorted(_checks.items(), key=str):
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
        out[f"{name} {n_out}x{k}, {threads} thread{'s' if threads > 1 else ''}"] = dict(
            position_invariant=c.position_invariant, deterministic=c.deterministic, seconds=round(c.seconds, 3))
    return out


def holds() -> bool:
    """False when a checked GEMM gave a row other bits at another place in a call, or other bits for the same
    call: exact mode cannot promise token-identical outputs then. True otherwise, including before any check."""
    return all(c.holds for c in _checks.values())
