"""bf16 exact mode on hybrid targets: greedy chain speculative decoding equals plain decoding token for token, each
row alone and in a ragged batch, and the batch's plain rows equal each prompt decoded alone (the recurrent layers'
steps run as plain decoding runs them, the linear layers in exact mode's calls of fixed shapes). The fast path is
not asserted (near-ties may flip there)."""

from __future__ import annotations

import pytest
import torch

from drafterkit.decode import exact_mode, generate
from drafterkit.drafters.ngram import NGramDrafter
from families import one_thread  # noqa: F401 -- autouse, one intra-op thread here
from test_decode_hybrid_targets import HYBRIDS, NEW, ROWS, build, per_family


@pytest.mark.parametrize("family", per_family(sorted(HYBRIDS)))
def test_bf16_exact_mode_chains_and_batches_equal_plain(family):
    target = build(family).to(torch.bfloat16)
    drafter = build(family, noise=0.5).to(torch.bfloat16)
    with exact_mode():
        plain = [generate(target, [r], max_new_tokens=NEW, eos_token_id=[]).sequences[0] for r in ROWS]
        assert generate(target, ROWS, max_new_tokens=NEW, eos_token_id=[]).sequences == plain
        for d in (NGramDrafter(), drafter):
            assert [generate(target, [r], drafter=d, max_new_tokens=NEW, eos_token_id=[]).sequences[0]
                    for r in ROWS] == plain
            batch = generate(target, ROWS, drafter=d, max_new_tokens=NEW, num_draft_tokens=4, eos_token_id=[])
            assert batch.sequences == plain
        assert batch.stats.accepted > 0
