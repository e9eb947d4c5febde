"""Speculative decoding past a sliding attention window (decode.cache keeps full cache layers and applies each
sliding layer's window in the attention mask by absolute position): greedy chains, static trees and dynamic
trees over a ragged batch equal plain greedy decoding and transformers' own greedy ``generate``, fp32."""

from __future__ import annotations

import pytest
import torch
from families import build_family

from drafterkit.decode import generate
from drafterkit.decode.cache import RaggedCache
from drafterkit.drafters.draft_lm import DraftLM

WINDOW = 8
NEW = 20
# ragged rows: shorter than, equal to and longer than the window, so prefill and decoding both pass it
ROWS = [[5, 17, 33], [40, 41, 9, 12, 77, 3, 18, 20], [7, 61, 28, 90, 14, 45, 50, 11, 22, 31, 66]]


def _transformers_greedy(model, row: list[int]) -> list[int]:
    out = model.generate(torch.tensor([row]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         pad_token_id=0)
    return out[0, len(row):].tolist()


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "gemma3", "mistral"])
def test_greedy_speculative_past_the_window_equals_plain_and_transformers(family):
    target, _ = build_family(family, sliding_window=WINDOW)
    reference = [_transformers_greedy(target, r) for r in ROWS]
    plain = generate(target, ROWS, max_new_tokens=NEW, eos_token_id=[]).sequences
    assert plain == reference
    # the window changes the output: a target with the same weights and a window past the sequence differs
    wide, _ = build_family(family, sliding_window=256)
    assert generate(wide, ROWS, max_new_tokens=NEW, eos_token_id=[]).sequences != plain
    drafter = DraftLM.from_target(target, 1)  # a truncated target: rejects some draft tokens
    for tree in (None, "2,2,1", "dynamic:8:3:2"):
        got = generate(target, ROWS, drafter=drafter, max_new_tokens=NEW, eos_token_id=[], num_draft_tokens=3,
                       tree=tree)
        assert got.stats.accepted < got.stats.drafted, tree  # rollbacks happened past the window
        assert got.sequences == plain, tree


def test_ragged_cache_keeps_full_layers_and_crops_past_the_window():
    target, _ = build_family("gemma2", sliding_window=WINDOW)
    c = RaggedCache(target, 2, torch.device("cpu"))
    assert not any(c.cache.is_sliding) and c.window == WINDOW and not c.all_sliding
    c.prefill([list(range(3, 15)), [5, 6]], logits_to_keep=1)  # 12 tokens: past the window
    c.run(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    c.keep(torch.tensor([1, 3]))  # row 0 rejects 2 tokens: cropped, not rolled
    assert c.cache.get_seq_length() == 15 and c.n_real.tolist() == [13, 5]
    assert all(layer.keys.shape[2] == 15 for layer in c.cache.layers)
