"""drafters.ngram: prompt-lookup proposals, save/load through the strict base format."""

import json
import os
import random
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import DrafterLoadError, load_drafter
from drafterkit.drafters.ngram import NGramConfig, NGramDrafter, lookup
from conftest import require_vllm_python


def test_lookup_prefers_longest_then_earliest_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 2, 3]
    assert lookup(toks, 2, 3, 1) == [9, 1]  # "2 3" first followed by 9 1 (3-gram "8 2 3" absent), as vLLM
    assert lookup([5, 6, 5, 6, 5], 3, 3, 1) == [6, 5]  # continuation [6, 5], not padded
    assert lookup([4, 1, 2, 3], 3, 2, 2) == []  # no 2-gram match -> nothing proposed
    assert lookup([7, 8, 7], 4, 1, 1) == [8, 7]  # short continuation as found
    assert lookup([3], 2, 3, 1) == []
    assert lookup([3, 5, 3, 3, 5], 2, 1, 1) == [3, 3]  # a shorter key never wins over a longer one: 1-gram only here


def test_lookup_drafts_k_tokens_in_a_repetition_loop():
    """A target repeating a phrase of period p < k: the earliest occurrence of the key has the whole loop
    after it, so lookup drafts k tokens; the most recent one would stop after p (the end of the row)."""
    loop = [9] + [1, 2] * 6  # period 2
    assert lookup(loop, 5, 3, 1) == [1, 2, 1, 2, 1]
    assert lookup([7, 4, 4, 4, 4, 4, 4, 4], 4, 3, 1) == [4, 4, 4, 4]  # period 1: overlapping occurrences count
    d = NGramDrafter(NGramConfig(max_ngram=3))
    state = DecodeState(tokens=[loop, [5, 6, 7, 5, 6]], num_stable=[0, 0], features=None, active=[True, True],
                        vocab_size=10)
    assert d.propose(state, 5, SamplingParams(), None).lengths.tolist() == [5, 3]  # [5, 6]: 7 5 6 to the end


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
    assert conts == [[1, 9], [3, 4], [1, 2]]  # most recent first; the last is lookup()'s (the earliest)
    assert conts[-1] == lookup(row, 2, 2, 1)
    tree = DraftTree.parse("3,2")
    toks, ok = fill_tree(tree, conts)
    idx = {p: i for i, p in enumerate(tree.paths)}
    assert toks[idx[(0,)]] == 1 and toks[idx[(1,)]] == 3 and not ok[idx[(2,)]]  # 1 twice, 3 once
    assert toks[idx[(0, 0)]] == 9 and toks[idx[(0, 1)]] == 2  # after 1: 9 (more recent), then 2
    assert toks[idx[(1, 0)]] == 4 and not ok[idx[(1, 1)]]
    assert fill_tree(tree, []) == ([0] * tree.num_nodes, [False] * tree.num_nodes)
    assert continuations([1, 2, 3], 4, 3, 1) == []


VLLM_NGRAM = """import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find
cases = json.load(sys.stdin)
print(json.dumps([find(np.array(c["tokens"], dtype=np.int32), c["min_n"], c["max_n"], 1 << 20, c["k"]).tolist()
                  for c in cases]))
"""


@pytest.mark.serving
def test_lookup_equals_vllm_ngram_method():
    """The same draft as vLLM's ``ngram`` method (its own function, run in the vLLM venv) on random rows over a
    4-token vocabulary (many matches, ties between occurrences) and repetition loops, for several n ranges."""
    python = require_vllm_python()
    rng = random.Random(0)
    rows = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    rows += [[rng.randrange(9)] + [1, 2, 3][:p] * 8 for p in (1, 2, 3) for _ in range(10)]
    cases = [dict(tokens=r, k=rng.randrange(1, 8), min_n=lo, max_n=hi)
             for r in rows for lo, hi in ((1, 3), (2, 4), (1, 1), (5, 5))]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run([str(python), "-c", VLLM_NGRAM], input=json.dumps(cases), capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    vllm = json.loads(out.stdout.strip().splitlines()[-1])
    mine = [lookup(c["tokens"], c["k"], c["max_n"], c["min_n"]) for c in cases]
    assert sum(len(d) > 0 for d in vllm) > len(cases) // 2  # most rows match: the comparison is not vacuous
    assert mine == vllm
