"""decode.exact_mode: one switch for the decoder's bitwise-exact mode; ``decode.generate`` defaults to the fast
path (exact mode costs ~5-20% of tokens/s by CPU and draft shape, docs/benchmarks/exactness.md), eval turns it on."""

from __future__ import annotations

import pytest
import torch

from drafterkit import decode
from drafterkit.decode import attention, fused
from drafterkit.decode.attention import EXACT_NAME, NAME
from drafterkit.decode.fused import bitwise_exact
from drafterkit.drafters.ngram import NGramDrafter
from conftest import tiny_llama

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repeats, so prompt lookup drafts multi-token trees


def _attention_seen(target, **kw) -> set[str]:
    """The attention implementations the target's first layer ran under during one speculative generate."""
    seen = []
    hook = target.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.config._attn_implementation))
    try:
        out = decode.generate(target, [PROMPT], drafter=NGramDrafter(), max_new_tokens=12, tree="2,1", **kw)
    finally:
        hook.remove()
    assert out.counts.drafted > 0
    return set(seen)


def test_generate_defaults_to_the_fast_path():
    target = tiny_llama(0)
    assert not decode.exact_mode_enabled() and not attention.EXACT and not fused.ROW_INVARIANT
    assert not bitwise_exact(torch.bfloat16, "cpu") and bitwise_exact(torch.float32, "cpu")
    assert _attention_seen(target) == {NAME}  # the packed verification pass, not the exact per-query one


def test_exact_mode_is_a_context_manager_that_restores_the_mode_found():
    target = tiny_llama(0)
    with decode.exact_mode() as mode:
        assert isinstance(mode, decode.exact_mode)
        assert decode.exact_mode_enabled() and attention.EXACT and fused.ROW_INVARIANT
        assert bitwise_exact(torch.bfloat16, "cpu") and not bitwise_exact(torch.bfloat16, "cuda")
        assert _attention_seen(target) == {EXACT_NAME}
        with decode.exact_mode(False):  # nested: off inside, on again after
            assert not decode.exact_mode_enabled() and _attention_seen(target) == {NAME}
        assert decode.exact_mode_enabled()
    assert not decode.exact_mode_enabled()
    with pytest.raises(RuntimeError), decode.exact_mode():
        raise RuntimeError("a failed decode")
    assert not decode.exact_mode_enabled() and not attention.EXACT and not fused.ROW_INVARIANT


def test_exact_mode_called_plainly_sets_the_mode_until_changed():
    try:
        decode.exact_mode(True)
        assert decode.exact_mode_enabled() and attention.EXACT and fused.ROW_INVARIANT
        decode.exact_mode(False)
        assert not decode.exact_mode_enabled() and not attention.EXACT and not fused.ROW_INVARIANT
    finally:
        decode.exact_mode(False)
