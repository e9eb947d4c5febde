"""Speculative decoding on every family's tiny target (``tests/families.py``) equals plain greedy decoding, also
past a sliding attention window (the verification pass then rolls back a cache whose window is full)."""

from __future__ import annotations

import pytest
from families import FAMILIES, SLIDING, build_family, family_prompts

from drafterkit.decode import generate
from drafterkit.drafters.draft_lm import DraftLM

WINDOW = 8  # prompts of 6 tokens + 14 new: the sequence passes the window


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_decoding_past_the_sliding_window_equals_plain(family):
    overrides = {"sliding_window": WINDOW} if family in SLIDING else {}
    target, _ = build_family(family, **overrides)
    drafter = DraftLM.from_target(target, 1)  # a truncated target: rejects some draft tokens
    prompts = family_prompts(2)
    plain = generate(target, prompts, max_new_tokens=14, eos_token_id=[]).sequences
    got = generate(target, prompts, drafter=drafter, max_new_tokens=14, eos_token_id=[], num_draft_tokens=3)
    assert got.stats.accepted < got.stats.drafted  # rollbacks happened
    assert got.sequences == plain
