"""Row-count invariant linear layers (``decode.invariance``): in exact mode every bf16 / fp16 linear row gets the
bits it gets alone, whatever pass it is in, and a GEMM whose rows depend on their place in a call or that is not
deterministic voids the guarantee instead of being trusted. The GEMMs with a known dependence below are real
functions built for the test (one reduction order up to a row count or place, another past it), so the
assertions hold on any CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import exact_mode, fused, invariance
from drafterkit.decode.fused import bitwise_exact, engine_groups, fused_projections

W = (torch.randn(96, 80, generator=torch.Generator().manual_seed(0)) * 0.1).bfloat16()
X = torch.randn(100, 80, generator=torch.Generator().manual_seed(2)).bfloat16()


def _split_k(x):
    """The same product reduced in two halves of K, each rounded to bf16 before the sum: another reduction
    order, so some outputs differ in the last bit, as two CPU kernels' do."""
    return x[:, :40] @ W[:, :40].t() + x[:, 40:] @ W[:, 40:].t()


def _switches_past_32(x):
    """A GEMM whose rounding changes past 32 rows, as oneDNN's switch to its AMX kernel on an Intel Xeon."""
    return x @ W.t() if x.shape[0] <= 32 else _split_k(x)


def _one_row_apart(x):
    """A GEMM whose one-row call rounds apart, as oneDNN's one-row kernel on an AMD EPYC does."""
    return _split_k(x) if x.shape[0] == 1 else x @ W.t()


def _alone(gemm) -> torch.Tensor:
    return torch.cat([gemm(X[i: i + 1]) for i in range(len(X))])


@pytest.mark.parametrize("gemm", [_switches_past_32, _one_row_apart])
def test_run_gives_every_row_its_own_bits_whatever_the_row_count(gemm):
    assert not torch.equal(gemm(X), _alone(gemm))  # called plainly the rows depend on M, or this shows nothing
    alone = torch.cat([invariance.run(gemm, X[i: i + 1]) for i in range(len(X))])
    for m in (1, 2, 5, 16, 17, 33, 100):
        assert torch.equal(invariance.run(gemm, X[:m]), alone[:m]), m


def _last_rows_apart(x):
    """A GEMM whose last quarter of rows take another reduction order (a tail kernel): a row's bits depend on
    its place in the call."""
    cut = x.shape[0] * 3 // 4
    return torch.cat([x[:cut] @ W.t(), _split_k(x[cut:])])


@pytest.mark.parametrize("gemm", [_last_rows_apart, "noisy"])
def test_a_gemm_whose_rows_depend_on_their_place_or_that_is_not_deterministic_voids_the_guarantee(
        gemm, monkeypatch):
    monkeypatch.setattr(invariance, "_checks", {})
    if gemm == "noisy":  # the first call rounds apart from every later identical call
        calls = []

        def gemm(x):
            calls.append(1)
            y = x @ W.t()
            return torch.nextafter(y, y + 1) if len(calls) == 1 else y

    with pytest.warns(UserWarning, match="exact mode: the bfloat16 GEMM of a 96x80 linear layer gave other bits"):
        found = invariance.check((), gemm, 80, 96, torch.bfloat16, torch.device("cpu"))
    assert not found.holds
    with exact_mode():
        assert not invariance.holds()
        assert not bitwise_exact(torch.bfloat16, "cpu")
        assert bitwise_exact(torch.float32, "cpu")


def test_a_well_behaved_gemm_passes_its_check(monkeypatch):
    monkeypatch.setattr(invariance, "_checks", {})
    assert invariance.check((), _switches_past_32, 80, 96, torch.bfloat16, torch.device("cpu")).holds
    assert invariance.holds()


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
