"""decode.attention: the packed GQA attention of verification passes equals transformers' SDPA path."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from drafterkit import decode
from drafterkit.decode import attention
from drafterkit.decode.attention import EXACT_NAME, NAME, packed_gqa_sdpa, verification_attention
from drafterkit.decode.tree import DraftTree
from drafterkit.drafters.ngram import NGramDrafter
from conftest import tiny_llama


class _Attn(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _tree_mask(m: int, past: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tree = torch.tril(torch.rand(m, m, generator=g) < 0.6) | torch.eye(m, dtype=torch.bool)
    return torch.cat([torch.ones(m, past, dtype=torch.bool), tree], 1)[None, None]  # [1, 1, m, L]


@pytest.mark.parametrize("groups,m,additive", [(3, 6, False), (3, 6, True), (2, 4, True), (4, 1, False), (1, 5, True)])
def test_packed_gqa_matches_transformers_sdpa(groups, m, additive):
    torch.manual_seed(groups * 10 + m)
    b, hkv, d, past = 2, 3, 16, 11
    q = torch.randn(b, hkv * groups, m, d)
    k, v = torch.randn(b, hkv, past + m, d), torch.randn(b, hkv, past + m, d)
    mask = _tree_mask(m, past, m).expand(b, 1, m, past + m)
    if additive:
        mask = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
    mod = _Attn(groups)
    want, _ = sdpa_attention_forward(mod, q, k, v, mask, scaling=d ** -0.5)
    got, _ = packed_gqa_sdpa(mod, q, k, v, mask, scaling=d ** -0.5)
    assert got.shape == want.shape == (b, m, hkv * groups, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_verification_passes_use_it_and_the_model_is_restored():
    target = tiny_llama(0)  # 4 query heads over 2 KV heads
    assert target.config._attn_implementation == "sdpa"
    seen = []
    hook = target.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.config._attn_implementation))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repeats, so prompt lookup drafts multi-token trees
    try:
        with decode.exact_mode():  # the engine's exact attention (tests/test_decode_exact.py)
            out = decode.generate(target, [prompt], drafter=NGramDrafter(), max_new_tokens=12,
                                  tree=DraftTree.parse("2,1"))
            assert out.sequences[0] == decode.generate(target, [prompt], max_new_tokens=12).sequences[0]
    finally:
        hook.remove()
    assert out.counts.drafted > 0
    assert seen and set(seen) == {EXACT_NAME}
    assert target.config._attn_implementation == "sdpa"  # transformers' generate baseline runs stock code
    seen.clear()
    hook = target.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.config._attn_implementation))
    try:  # the default, the fast path: the packed pass
        decode.generate(target, [prompt], drafter=NGramDrafter(), max_new_tokens=4, tree=DraftTree.parse("2,1"))
    finally:
        hook.remove()
    assert seen and set(seen) == {NAME} and not attention.EXACT


def test_other_attention_implementations_are_left_alone():
    target = tiny_llama(0)
    target.set_attn_implementation("eager")
    with verification_attention(target):
        assert target.config._attn_implementation == "eager"
    assert target.config._attn_implementation == "eager"
