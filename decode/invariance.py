"""Row-count invariant linear layers for the decoder's exact mode: GEMM calls of a few fixed, checked shapes.

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

So exact mode assumes nothing of how a kernel picks its path by M: :func:`run` computes every input in calls of a
few fixed row counts (:data:`SHAPES`, the last call zero-padded), and a layer uses a wider shape than the base
one (8 rows: a plain step, a chain of up to 7 draft tokens) only where :func:`check` found that rows get the
base shape's bits in it. The check runs once per layer shape and thread count on seeded rows: each row at two
places in a base call (a row's bits must depend on its own values alone), the same call twice (a deterministic
GEMM), then each wider shape against the base, stopping at the first that differs (on the Intel Xeon above: 8,
16 and 32 agree, 64 runs the AMX kernel). A layer whose base shape fails is recorded (:func:`holds` is False)
with one warning: ``decode.fused.bitwise_exact`` then says exactness is not guaranteed and an eval reports its
texts' differences as unchecked, instead of claiming them. The wider shapes' agreement is sampled (2^16 outputs
per shape), so a rare last-bit difference could go unseen; eval still compares every text with plain decoding's.

What it costs, per CPU: docs/benchmarks/exactness.md.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["BASE", "SHAPES", "Check", "check", "checks", "holds", "run"]

#: the row counts exact mode calls a GEMM with: the base shape (a plain step's rows, a chain's K + 1 up to 8) and
#: the wider shapes a bigger pass (a tree's nodes, a ragged batch, a prefill) may use where the check found that
#: each row gets the base shape's bits in them; CPU GEMMs switch kernels by row count (oneDNN's AMX kernel from 33
#: rows on an Intel Xeon), so which ones agree is machine-dependent and checked, not assumed
SHAPES = (8, 16, 32, 64, 128)
BASE = SHAPES[0]

#: outputs compared per check (rows x out_features), at least one call of the widest shape
CHECK_OUTPUTS = 1 << 16

_lock = threading.Lock()
_checks: dict[tuple, Check] = {}


@dataclass(frozen=True)
class Check:
    """What :func:`check` found for one layer shape.

    Attributes:
        shapes: the call shapes (row counts) rows may run in: :data:`BASE` and every wider one of
            :data:`SHAPES`, in order, that gave each row the base shape's bits (stopping at the first that
            did not).
        position_invariant: each row got the same bits at two places in a base-shape call.
        deterministic: the same call gave the same bits twice.
        seconds: how long the check took (wall clock).
    """

    shapes: tuple[int, ...]
    position_invariant: bool
    deterministic: bool
    seconds: float

    @property
    def holds(self) -> bool:
        return self.position_invariant and self.deterministic


def run(matmul: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor,
        shapes: tuple[int, ...] = (BASE,)) -> torch.Tensor:
    """``matmul(rows)`` computed in calls of one of ``shapes``' row counts, zero-padded: one call of the
    smallest shape that holds every row, else calls of the widest.

    Args:
        matmul: a linear layer's GEMM, ``[M, in] -> [M, out]``.
        rows: ``[M, in]``.
        shapes: allowed row counts per call, ascending (:attr:`Check.shapes`).

    Returns:
        ``[M, out]``; row ``i``'s bits come from a call of an allowed shape whatever ``M`` is.
    """
    n = rows.shape[0]
    size = next((s for s in shapes if s >= n), shapes[-1])
    pad = -n % size
    if pad:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))
    if n + pad == size:  # a decoding step, a verification pass: one call
        out = matmul(rows)
    else:
        out = torch.cat([matmul(rows[s: s + size]) for s in range(0, n + pad, size)])
    return out[:n] if pad else out


def _check(matmul: Callable[[torch.Tensor], torch.Tensor], in_features: int, out_features: int,
           dtype: torch.dtype, device: torch.device) -> Check:
    start = time.perf_counter()
    widest = SHAPES[-1]
    n = widest * max(1, -(-CHECK_OUTPUTS // (widest * out_features)))
    x = torch.randn(n, in_features, generator=torch.Generator().manual_seed(in_features)).to(device, dtype)
    base = run(matmul, x)
    half = BASE // 2  # the same rows, each half a call further on
    shifted = run(matmul, torch.nn.functional.pad(x, (0, 0, half, 0)))[half:]
    deterministic = torch.equal(run(matmul, x[:BASE]), base[:BASE])
    shapes = [BASE]
    for size in SHAPES[1:]:
        if not torch.equal(run(matmul, x, (size,)), base):
            break
        shapes.append(size)
    return Check(tuple(shapes), torch.equal(base, shifted), deterministic, time.perf_counter() - start)


def check(key: tuple, matmul: Callable[[torch.Tensor], torch.Tensor], in_features: int, out_features: int,
          dtype: torch.dtype, device: torch.device) -> Check:
    """The :class:`Check` of the GEMM ``matmul`` (``[M, in_features] -> [M, out_features]``), run on first use
    and cached under ``(out_features, in_features, dtype, torch.get_num_threads()) + key``.

    Args:
        key: words for what else selects the GEMM's kernel (``("prepacked",)``, ``("bias",)``), part of the
            name :func:`checks` reports it under.
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
    """Every check run in this process, for reports: ``{"bf16 576x1536 prepacked, 2 threads": {"shapes",
    "position_invariant", "deterministic", "seconds"}}`` (``out_features x in_features``)."""
    out = {}
    for (n_out, k, dtype, threads, *key), c in sorted(_checks.items(), key=str):
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
        what = "".join(f" {part}" for part in key)
        out[f"{name} {n_out}x{k}{what}, {threads} thread{'s' if threads > 1 else ''}"] = dict(
            shapes=list(c.shapes), position_invariant=c.position_invariant, deterministic=c.deterministic,
            seconds=round(c.seconds, 3))
    return out


def holds() -> bool:
    """False when a checked GEMM gave a row other bits at another place in a call, or other bits for the same
    call: exact mode cannot promise token-identical outputs then. True otherwise, including before any check."""
    return all(c.holds for c in _checks.values())
