"""A bf16 linear layer for a few rows (a verification pass's K + 1 tokens, a drafting step) that reads each weight once.

On a CPU a decoding step is bound by reading the weights: one row's GEMM should cost what its weight bytes cost.
PyTorch's bf16 GEMM (oneDNN) costs more than that for one row and 1.3-2x it at 6-16 rows on a 2-core AMD CPU with
AVX-512 BF16, and inductor's C++ GEMM template (bf16 converted to fp32, fp32 FMAs) 2-5x at 6 rows; on a CPU with AVX2
only, where oneDNN has no bf16 GEMM, PyTorch's generic loop costs ~4.7x at 6 rows what it costs at one
(``docs/benchmarks/engine.md``). :func:`linear` computes ``x @ W^T`` for up to :data:`ROWS` rows over a weight
packed once (:func:`pack`), with AVX-512 BF16 dot products (``VDPBF16PS``) where the CPU has them and with AVX2
FMAs on the weights widened to fp32 elsewhere: each
64-byte weight load feeds every row's arithmetic, and each tile prefetches the next tile's weights into L2 while it
computes, so a few rows cost little more than one until the arithmetic, not the loads, bounds it. fp32
accumulation, the result rounded to bf16 (nearest even), as oneDNN's; the sums' order differs, so values can differ
from oneDNN's by an ulp.

The kernel (``decode/few_rows.cpp``) is built on first use with PyTorch's extension builder (a C++ compiler and
ninja, ~30 s once; kept in PyTorch's extensions folder) and registers the operators ``drafterkit::few_rows_linear``
(AVX-512 BF16) and ``drafterkit::few_rows_linear_avx2``, which compiled graphs (``decode/compiled.py``) call without
Python in between. :func:`available` is False, and callers keep oneDNN's GEMM, on a CPU with neither instruction set
or where the build fails (said once, on stderr, with the reason).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

#: the most rows :func:`linear` takes (a chain's verification pass up to K = 15, a tree of up to 15 nodes)
ROWS = 16

#: output columns per packed block (one AVX-512 register of fp32 sums)
COLS = 16

_state: dict = {}


def available() -> bool:
    """Whether :func:`linear` runs here: a CPU with AVX-512 BF16 or AVX2 and the kernel built (on the first call)."""
    if "lib" not in _state:
        _state["lib"] = _build()
    return _state["lib"] is not None


def kernels() -> dict:
    """The kernel's builds this CPU runs, by instruction set: ``"avx512_bf16"`` (``drafterkit::few_rows_linear``)
    and / or ``"avx2"`` (``drafterkit::few_rows_linear_avx2``), each taking :func:`linear`'s arguments. Empty where
    :func:`available` is False. :func:`linear` runs the first."""
    if not available():
        return {}
    ops = torch.ops.drafterkit
    found = {"avx512_bf16": ops.few_rows_linear} if torch.cpu._is_avx512_bf16_supported() else {}
    if _has_avx2():
        found["avx2"] = ops.few_rows_linear_avx2
    return found


def fits(weight: torch.Tensor) -> bool:
    """Whether :func:`linear` can run ``weight [N, K]``: a bf16 CPU tensor with ``K`` even, on a CPU where the kernel
    runs (:func:`available`)."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.shape[1] % 2 == 0 and available())


def _has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # ATen's AVX2 level includes FMA


def _build():
    if not _has_avx2():
        return None
    try:
        build("drafterkit_few_rows", Path(__file__).with_suffix(".cpp"))
        ops = torch.ops.drafterkit
        for op in ("few_rows_linear", "few_rows_linear_avx2"):
            torch.library.register_fake(f"drafterkit::{op}")(_shape)
        return ops.few_rows_linear if torch.cpu._is_avx512_bf16_supported() else ops.few_rows_linear_avx2
    except Exception as exc:  # noqa: BLE001 -- no compiler, no ninja, a failed build: oneDNN's GEMM runs, said once
        print(f"drafterkit: the few-row bf16 GEMM kernel did not build ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}); oneDNN's GEMM runs instead", file=sys.stderr)
        return None


def build(name: str, source: Path) -> None:
    """Build the kernel's C++ ``source`` as the extension library ``name`` and load it (its operators register on
    load), with the flags every build of the kernel uses: ``benchmarks/few_rows_gemm.py --against`` builds another
    revision's source alike. Raises what PyTorch's extension builder raises (no compiler, no ninja, a failed build)."""
    from torch.utils import cpp_extension  # the builder imports setuptools: only where the kernel is built

    cpp_extension.load(name=name, sources=[str(source)], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                       is_python_module=False, verbose=False)


def _shape(x, packed, bias, n):
    return x.new_empty(*x.shape[:-1], n)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` bf16 (``K`` even) -> ``[ceil(N / 16), K / 2, 32]`` bf16: per block of 16 output columns, per
    pair of input positions, the columns' two weights side by side (zero columns pad the last block).

    Raises:
        ValueError: not a 2-D bf16 weight with an even input size.
    """
    if weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
        raise ValueError(f"few_rows.pack takes a [N, K] bf16 weight with K even, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
    n, k = weight.shape
    blocks = -(-n // COLS)
    padded = torch.zeros(blocks * COLS, k, dtype=weight.dtype, device=weight.device)
    padded[:n] = weight.detach()
    return padded.view(blocks, COLS, k // 2, 2).permute(0, 2, 1, 3).contiguous().view(blocks, k // 2, 2 * COLS)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """``x [..., K]`` bf16 (at most :data:`ROWS` rows in all) times the weight :func:`pack` made (``n`` output
    columns), plus ``bias [n]`` bf16 -> ``[..., n]`` bf16: the operator of the widest instruction set the CPU has
    (:func:`kernels`). Needs :func:`available`.

    Raises:
        RuntimeError: more than :data:`ROWS` rows, not bf16, or a packed weight that does not fit ``x`` or ``n``.
    """
    return _state["lib"](x, packed, bias, n)
