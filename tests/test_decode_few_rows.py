"""decode.few_rows: the few-row bf16 GEMM kernel computes x @ W^T (+ bias) as a float reference does, up to bf16
rounding, for every row count it takes; its packing is the layout the kernel reads; compiled graphs call it; and
decode.compiled.Linear sends a few rows to it and more rows to ATen's linear.

The kernel has two builds, AVX-512 BF16 and AVX2; each test of the arithmetic runs every build the CPU runs
(``few_rows.kernels()``: both on a CPU with AVX-512 BF16) and is skipped with that reason for a build it cannot run.
On a CPU with neither ``few_rows.available()`` is False and callers keep ATen's GEMM (the packing and the fallback are
tested everywhere).
"""

from __future__ import annotations

import pytest
import torch

from drafterkit.decode import compiled, few_rows

needs_kernel = pytest.mark.skipif(not few_rows.available(), reason="the CPU has neither AVX-512 BF16 nor AVX2 (or the "
                                  "kernel did not build: see stderr); callers keep ATen's GEMM")

BUILDS = ("avx512_bf16", "avx2")


def build(isa: str):
    """The kernel's build for ``isa``; the test is skipped where this CPU does not run it."""
    op = few_rows.kernels().get(isa)
    if op is None:
        pytest.skip(f"this CPU does not run the kernel's {isa} build (or the kernel did not build: see stderr)")
    return op


def weights(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g).to(torch.bfloat16), torch.randn(n, generator=g).to(torch.bfloat16))


def test_pack_puts_each_pair_of_inputs_side_by_side_per_block_of_16_columns():
    w, _ = weights(37, 10)
    p = few_rows.pack(w)
    assert p.shape == (3, 5, 32)
    for n in range(48):
        for k in range(10):
            want = w[n, k] if n < 37 else 0
            assert p[n // 16, k // 2, 2 * (n % 16) + k % 2] == want
    with pytest.raises(ValueError, match="K even"):
        few_rows.pack(torch.zeros(4, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bf16"):
        few_rows.pack(torch.zeros(4, 4))


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("n,k", [(37, 64), (96, 576), (1000, 130)])
def test_kernel_matches_a_float_reference_for_every_row_count_it_takes(isa, n, k):
    op = build(isa)
    w, b = weights(n, k)
    p = few_rows.pack(w)
    for m in range(1, few_rows.ROWS + 1):
        x = torch.randn(1, m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        for bias in (b, None):
            ref = x.float() @ w.float().t() + (0 if bias is None else bias.float())
            y = op(x, p, bias, n)
            assert y.shape == (1, m, n) and y.dtype == torch.bfloat16
            # fp32 sums rounded once to bf16: within a bf16 ulp of the reference, plus fp32 summation-order noise
            torch.testing.assert_close(y.float(), ref, atol=1e-3 * k ** 0.5, rtol=2 ** -8)


@pytest.mark.parametrize("isa", BUILDS)
def test_kernel_rounds_exact_sums_to_the_nearest_even_bf16(isa):
    # integer inputs and weights: every fp32 sum is exact, so the only rounding is the final one to bf16, which must
    # be round-to-nearest-even (ties included: sums above 256 need more than bf16's 8 significant bits)
    op = build(isa)
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-8, 9, (45, 96), generator=g).to(torch.bfloat16)
    b = torch.randint(-300, 301, (45,), generator=g).to(torch.bfloat16)
    p = few_rows.pack(w)
    for m in (1, 2, 5, 6, 11, 16):
        x = torch.randint(-8, 9, (m, 96), generator=g).to(torch.bfloat16)
        ref = x.double() @ w.double().t() + b.double()
        assert torch.equal(op(x, p, b, 45), ref.to(torch.bfloat16))


@pytest.mark.parametrize("isa", BUILDS)
def test_a_non_finite_input_spoils_its_own_row_only(isa):
    op = build(isa)
    w, b = weights(40, 64)
    p = few_rows.pack(w)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[2, 5] = float("nan")
    x[4, 7] = float("inf")
    y = op(x, p, b, 40)
    assert y[2].isnan().all() and not y[4].isfinite().any()
    clean = [0, 1, 3, 5]
    torch.testing.assert_close(y[clean], op(x[clean], p, b, 40), atol=0, rtol=0)


@needs_kernel
def test_kernel_refuses_what_it_cannot_take():
    w, _ = weights(32, 64)
    p = few_rows.pack(w)
    with pytest.raises(RuntimeError, match=f"1 to {few_rows.ROWS} rows"):
        few_rows.linear(torch.zeros(few_rows.ROWS + 1, 64, dtype=torch.bfloat16), p, None, 32)
    with pytest.raises(RuntimeError, match="bf16"):
        few_rows.linear(torch.zeros(2, 64), p, None, 32)
    with pytest.raises(RuntimeError, match="does not fit"):
        few_rows.linear(torch.zeros(2, 62, dtype=torch.bfloat16), p, None, 32)


@pytest.mark.parametrize("isa", BUILDS)
def test_a_compiled_graph_calls_the_kernel(isa):
    op = build(isa)
    w, b = weights(40, 64)
    p = few_rows.pack(w)
    fn = torch.compile(lambda x: torch.relu(op(x, p, b, 40)), fullgraph=True, dynamic=True)
    for m in (1, 3, 8, 9, few_rows.ROWS):
        x = torch.randn(m, 64).to(torch.bfloat16)
        assert torch.equal(fn(x), torch.relu(op(x, p, b, 40)))


def test_compiled_linear_sends_few_rows_to_the_kernel_and_more_to_aten():
    lin = torch.nn.Linear(64, 40).to(torch.bfloat16)
    layer = compiled.Linear(lin)
    assert (layer.packed is not None) == few_rows.available()
    with torch.no_grad():
        for m in (1, 8, 9, few_rows.ROWS, few_rows.ROWS + 1, 30):
            x = torch.randn(m, 64).to(torch.bfloat16)
            ref = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
            torch.testing.assert_close(layer(x).float(), ref, atol=0.05, rtol=2 ** -7)
            if m > few_rows.ROWS:  # ATen's linear, bit for bit
                assert torch.equal(layer(x), lin(x))
    assert compiled.Linear(torch.nn.Linear(64, 40)).packed is None  # fp32: ATen's GEMM
