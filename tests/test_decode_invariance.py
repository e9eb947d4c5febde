"""Row-count invariant linear layers (``decode.invariance``): in exact mode every bf16 / fp16 linear row gets the
bits it gets alone, whatever pass it is in, and a GEMM whose rows depend on their place in a call or that is not
deterministic voids the guarantee instead of being trusted. The GEMMs with a known dependence below are real
functions built for the test (one rounding up to a row count or place, another past it, over products exact in
fp32), so the assertions hold on any CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import exact_mode, fused, invariance
from drafterkit.decode.fused import bitwise_exact, engine_groups, fused_projections

# small integers (inputs rounded to them, as the check feeds its own seeded rows): every product and sum is exact
# in fp32, so _exact gives the same bits for any row count on any CPU, and the GEMMs below differ from it only
# where they are built to
W = torch.randint(-3, 4, (96, 80), generator=torch.Generator().manual_seed(0)).bfloat16()
X = torch.randint(-3, 4, (100, 80), generator=torch.Generator().manual_seed(2)).bfloat16()


def _exact(x):
    return (x.float().round() @ W.float().t()).bfloat16()


def _apart(x):
    """Another rounding of the same product: one ulp up, as another kernel's reduction order gives."""
    y = _exact(x)
    return torch.nextafter(y, y + 1)


def _switches_past_32(x):
    """A GEMM whose rounding changes past 32 rows, as oneDNN's switch to its AMX kernel on an Intel Xeon."""
    return _exact(x) if x.shape[0] <= 32 else _apart(x)


def _one_row_apart(x):
    """A GEMM whose one-row call rounds apart, as oneDNN's one-row kernel on an AMD EPYC does."""
    return _apart(x) if x.shape[0] == 1 else _exact(x)


def _alone(gemm) -> torch.Tensor:
    return torch.cat([gemm(X[i: i + 1]) for i in range(len(X))])


@pytest.mark.parametrize("gemm", [_switches_past_32, _one_row_apart])
def test_run_gives_every_row_its_own_bits_whatever_the_row_count(gemm):
    assert not torch.equal(gemm(X), _alone(gemm))  # called plainly the rows depend on M, or this shows nothing
    alone = torch.cat([invariance.run(gemm, X[i: i + 1]) for i in range(len(X))])
    for m in (1, 2, 5, 16, 17, 33, 100):
        assert torch.equal(invariance.run(gemm, X[:m]), alone[:m]), m


def _last_rows_apart(x):
    """A GEMM whose last quarter of rows round apart (a tail kernel): a row's bits depend on its place in the
    call."""
    cut = x.shape[0] * 3 // 4
    return torch.cat([_exact(x[:cut]), _apart(x[cut:])])


@pytest.mark.parametrize("gemm", [_last_rows_apart, "noisy"])
def test_a_gemm_whose_rows_depend_on_their_place_or_that_is_not_deterministic_voids_the_guarantee(
        gemm, monkeypatch):
    monkeypatch.setattr(invariance, "_checks", {})
    if gemm == "noisy":  # the first call rounds apart from every later identical call
        calls = []

        def gemm(x):
            calls.append(1)
            return _apart(x) if len(calls) == 1 else _exact(x)

    with pytest.warns(UserWarning, match="exact mode: the bfloat16 GEMM of a 96x80 linear layer gave other bits"):
        found = invariance.check((), gemm, 80, 96, torch.bfloat16, torch.device("cpu"))
    assert not found.holds
    with exact_mode():
        assert not invariance.holds()
        assert not bitwise_exact(torch.bfloat16, "cpu")
        assert bitwise_exact(torch.float32, "cpu")


def test_the_check_allows_the_wider_call_shapes_that_agree_with_the_base_one(monkeypatch):
    monkeypatch.setattr(invariance, "_checks", {})
    found = invariance.check((), _switches_past_32, 80, 96, torch.bfloat16, torch.device("cpu"))
    assert found.holds and found.shapes == (8, 16, 32) and invariance.holds()
    found = invariance.check(("another kernel",), _one_row_apart, 80, 96, torch.bfloat16, torch.device("cpu"))
    assert found.holds and found.shapes == invariance.SHAPES
    threads = torch.get_num_threads()
    assert [c["shapes"] for c in invariance.checks().values()] == [[8, 16, 32], list(invariance.SHAPES)]
    assert f"bf16 96x80 another kernel, {threads} thread{'s' if threads > 1 else ''}" in invariance.checks()


@pytest.mark.parametrize("gemm", [_switches_past_32, _one_row_apart, _exact])
def test_rows_keep_their_bits_in_every_pass_shape_the_check_allows(gemm):
    shapes = invariance._check(gemm, 80, 96, torch.bfloat16, torch.device("cpu")).shapes
    alone = torch.cat([invariance.run(gemm, X[i: i + 1], shapes) for i in range(len(X))])
    for m in (1, 7, 8, 9, 28, 33, 100):
        assert torch.equal(invariance.run(gemm, X[:m], shapes), alone[:m]), m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_exact_mode_each_linear_row_is_the_same_in_any_pass(dtype):
    """Every linear layer of a bf16 / fp16 target (merged projections, LM head), fed 1 to 300 rows: each row's
    output equals the row's output alone, which is what makes a ragged batch's prefill and a verification pass
    give plain decoding's bits."""
    model = tiny_llama(3, hidden_size=64, heads=4, kv_heads=2, intermediate=1536, layers=1).to(dtype)
    groups = engine_groups(model)
    assert {tuple(g.sizes) for g in groups} >= {(64, 32, 32), (64,), (1536, 1536)}  # merged q/k/v, o, gate/up
    x = torch.randn(300, 1536, generator=torch.Generator().manual_seed(3)).to(dtype)
    with exact_mode(), torch.inference_mode(), fused_projections(model):
        for g in groups:
            k = g.layers[0].in_features
            alone = torch.cat([g.forward(0, x[i: i + 1, :k].clone()) for i in range(300)])
            for m in (2, 7, 33, 64, 300):
                assert torch.equal(g.forward(0, x[:m, :k].clone()), alone[:m]), (g.sizes, m)
        assert invariance.holds()
    assert fused.ROW_INVARIANT is False  # exact_mode restored the fast path
