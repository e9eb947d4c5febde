"""Speculative decoding on every family's tiny target (``tests/families.py``) equals plain greedy decoding, also
past a sliding attention window (the verification pass then rolls back a cache whose window is full), and on
the decoder-only families (Llama-4's text model, DeepSeek-V2: rotary embeddings through ``torch.view_as_complex``)
in fp32 with chains and trees."""

from __future__ import annotations

import pytest
import torch
from families import DECODER_FAMILIES, FAMILIES, SLIDING, build_family, family_prompts

from drafterkit.decode import generate
from drafterkit.drafters.draft_lm import DraftLM

WINDOW = 8  # prompts of 6 tokens + 14 new: the sequence passes the window


@pytest.mark.parametrize("family", [*FAMILIES, *DECODER_FAMILIES])
def test_speculative_decoding_past_the_sliding_window_equals_plain(family):
    overrides = {"sliding_window": WINDOW} if family in SLIDING else {}
    target, _ = build_family(family, **overrides)
    drafter = DraftLM.from_target(target, 1)  # a truncated target: rejects some draft tokens
    prompts = family_prompts(2)
    plain = generate(target, prompts, max_new_tokens=14, eos_token_id=[]).sequences
    got = generate(target, prompts, drafter=drafter, max_new_tokens=14, eos_token_id=[], num_draft_tokens=3)
    assert got.stats.accepted < got.stats.drafted  # rollbacks happened
    assert got.sequences == plain


@pytest.mark.parametrize("tree", [None, "2,2,1"])
@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_view_as_complex_rotary_families_decode_exactly_in_fp32(family, tree):
    # the engine's few-row fp32 GEMMs (decode.fused) must hand the q/k projections back with a last dimension of
    # stride 1: these families' rotary embedding reinterprets them through torch.view_as_complex. One row (plain
    # decoding of one prompt) and several (a verification pass, a batch of two) both go through those GEMMs.
    target, _ = build_family(family)
    assert target.dtype == torch.float32
    drafter = DraftLM.from_target(target, 1)
    for prompts in (family_prompts(1), family_prompts(2, seed=1)):
        plain = generate(target, prompts, max_new_tokens=12, eos_token_id=[]).sequences
        got = generate(target, prompts, drafter=drafter, tree=tree, max_new_tokens=12, eos_token_id=[],
                       num_draft_tokens=3)
        assert got.stats.drafted > 0
        assert got.sequences == plain, (family, tree, len(prompts))
