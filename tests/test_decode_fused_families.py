"""The decoder's CPU kernels (``decode.fused``: merged projections, prepacked bf16 weights, few-row fp32 GEMMs)
on every model family: they apply where a family's layers match (separate ``q/k/v_proj`` merge into one GEMM,
a dense ``gate_proj`` / ``up_proj`` pair into another, biases included), fall back to the stock layers
elsewhere (Phi-3's already fused ``qkv_proj`` / ``gate_up_proj`` run as single layers, mixture-of-experts
weights are not ``nn.Linear`` and keep transformers' code), and decoding gives the same tokens with and
without them, in fp32 and bf16. Tiny seeded random targets of each family (``tests/families.py``)."""

from __future__ import annotations

import pytest
import torch
from families import (DECODER_FAMILIES, FAMILIES, build_family, family_prompts,  # noqa: F401 (one_thread: a fixture)
                      one_thread)

from drafterkit.decode import fused, generate

SEPARATE_QKV = set(FAMILIES) - {"phi3"}
DENSE_GATE_UP = set(FAMILIES) - {"phi3", "qwen3_moe", "gpt_oss"}


def _group_names(model, groups) -> list[tuple[str, ...]]:
    names = {id(m): n for n, m in model.named_modules()}
    return [tuple(names[id(lin)].rsplit(".", 1)[-1] for lin in g.layers) for g in groups]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_merged_projections_apply_where_the_layers_match(family):
    target, _ = build_family(family)
    layers = target.config.num_hidden_layers
    merged = [g for g in _group_names(target, fused.engine_groups(target)) if len(g) > 1]
    want = [("q_proj", "k_proj", "v_proj")] * (layers if family in SEPARATE_QKV else 0) + \
        [("gate_proj", "up_proj")] * (layers if family in DENSE_GATE_UP else 0)
    assert sorted(merged) == sorted(want), family
    # every other plain nn.Linear runs as a group of one in fp32 (few-row GEMM); nothing else is touched
    covered = {id(lin) for g in fused.engine_groups(target) for lin in g.layers}
    linears = {id(m) for m in target.modules() if type(m) is torch.nn.Linear}
    assert covered == linears, family


@pytest.mark.parametrize("family", [*FAMILIES, *DECODER_FAMILIES])
def test_decoding_is_unchanged_by_the_kernels(family, monkeypatch):
    target, _ = build_family(family)
    prompts = family_prompts(2)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 0.0)):  # bf16: packed weights give the same bits
        target = target.to(dtype)
        if dtype == torch.bfloat16 and any(g.kernel is not None for g in fused.engine_groups(target)):
            tol = 2e-2  # no oneDNN bf16 GEMM on this CPU: the few-row kernel, the stock values up to bf16 rounding
        monkeypatch.setattr(fused, "ENABLED", True)
        with_kernels = generate(target, prompts, max_new_tokens=6, eos_token_id=[]).sequences
        monkeypatch.setattr(fused, "ENABLED", False)
        stock = generate(target, prompts, max_new_tokens=6, eos_token_id=[]).sequences
        assert with_kernels == stock, (family, dtype)
        # a verification-sized pass (a few rows) through the engine copies equals the stock layers' logits
        monkeypatch.setattr(fused, "ENABLED", True)
        ids = torch.tensor(prompts)
        with torch.no_grad():
            ref = target(ids).logits.float()
            with fused.fused_projections(target):
                got = target(ids).logits.float()
        assert torch.allclose(got, ref, atol=tol, rtol=tol), (family, dtype, (got - ref).abs().max())
