"""drafters.ngram: prompt-lookup proposals, save/load through the strict base format."""

import pytest
import torch
from safetensors.torch import save_file

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import DrafterLoadError, load_drafter
from drafterkit.drafters.ngram import NGramConfig, NGramDrafter, lookup


def test_lookup_prefers_longest_most_recent_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 2, 3]
    assert lookup(toks, 2, 3, 1) == [7, 8]  # "2 3" most recently followed by 7 8 (3-gram "8 2 3" absent)
    assert lookup([5, 6, 5, 6, 5], 3, 3, 1) == [6, 5]  # continuation [6, 5], not padded
    assert lookup([4, 1, 2, 3], 3, 2, 2) == []  # no 2-gram match -> nothing proposed
    assert lookup([7, 8, 7], 4, 1, 1) == [8, 7]  # short continuation as found
    assert lookup([3], 2, 3, 1) == []


def test_propose_shapes_and_inactive_rows():
    d = NGramDrafter(NGramConfig(max_ngram=2))
    state = DecodeState(tokens=[[1, 2, 1], [4, 5]], num_stable=[0, 0], features=None, active=[True, False],
                        vocab_size=10)
    prop = d.propose(state, 3, SamplingParams(), None)
    assert prop.probs is None and prop.tokens.shape == (2, 3) and prop.tokens[0].tolist()[:2] == [2, 1]
    assert prop.lengths.tolist() == [2, 0]  # continuation [2, 1]; an inactive row proposes nothing


def test_bad_config_raises():
    with pytest.raises(ValueError, match="min_ngram"):
        NGramConfig(max_ngram=1, min_ngram=2)


def test_save_load_roundtrip_and_strict(tmp_path):
    NGramDrafter(NGramConfig(max_ngram=5, min_ngram=2)).save_pretrained(tmp_path / "ng")
    loaded = load_drafter(tmp_path / "ng")
    assert isinstance(loaded, NGramDrafter) and loaded.config == NGramConfig(5, 2)
    save_file({"stray": torch.zeros(1)}, str(tmp_path / "ng" / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="stray"):
        load_drafter(tmp_path / "ng")


def test_no_match_round_costs_one_plain_step(tiny_target):
    """Without any n-gram match the engine verifies no draft token: a plain step, exact output."""
    from drafterkit import decode
    prompt = [[5, 9, 17, 33, 60]]  # no repeated token: nothing to look up at first
    plain = decode.generate(tiny_target, prompt, max_new_tokens=12)
    spec = decode.generate(tiny_target, prompt, drafter=NGramDrafter(), max_new_tokens=12, num_draft_tokens=4)
    assert spec.sequences == plain.sequences
    s = spec.stats
    assert s.drafted <= 4 * s.target_forwards and s.accepted <= s.drafted
    assert s.committed - 1 == s.target_forwards + s.accepted  # each pass: accepted drafts + one token


def test_continuations_trie_fills_the_tree_by_frequency_then_recency():
    from drafterkit.decode.tree import DraftTree
    from drafterkit.drafters.ngram import continuations, fill_tree

    #        5 6 -> 1 2 | 5 6 -> 3 4 | 5 6 -> 1 9 | now: ... 5 6
    row = [5, 6, 1, 2, 5, 6, 3, 4, 5, 6, 1, 9, 5, 6]
    conts = continuations(row, 2, max_ngram=2, min_ngram=1)
    assert conts == [[1, 9], [3, 4], [1, 2]]  # most recent first; the first is lookup()'s continuation
    assert conts[0] == lookup(row, 2, 2, 1)
    tree = DraftTree.parse("3,2")
    toks, ok = fill_tree(tree, conts)
    idx = {p: i for i, p in enumerate(tree.paths)}
    assert toks[idx[(0,)]] == 1 and toks[idx[(1,)]] == 3 and not ok[idx[(2,)]]  # 1 twice, 3 once
    assert toks[idx[(0, 0)]] == 9 and toks[idx[(0, 1)]] == 2  # after 1: 9 (more recent), then 2
    assert toks[idx[(1, 0)]] == 4 and not ok[idx[(1, 1)]]
    assert fill_tree(tree, []) == ([0] * tree.num_nodes, [False] * tree.num_nodes)
    assert continuations([1, 2, 3], 4, 3, 1) == []
