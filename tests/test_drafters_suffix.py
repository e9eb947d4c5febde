"""drafters.suffix / suffix_tree / suffix_hybrid: suffix decoding against a brute-force reference, exactness
alone and behind a trained drafter (chains, static and dynamic trees, ragged batches), and its knobs."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import generate
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.lookup.suffix_hybrid import SuffixHybrid
from drafterkit.drafters.lookup.suffix_tree import CorpusSuffixIndex, SuffixTree, speculate
from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter


class Brute:
    """The suffix tree's definition, by scanning: ``count(path)`` = occurrences of ``path`` in the held
    sequences (``len(path) <= depth``); siblings by count, ties by the clock of their first occurrence."""

    def __init__(self, depth):
        self.max_depth, self.seqs = depth, {}  # seq id -> [(token, clock)]

    def add(self, seq, toks, clock):
        for t in toks:
            self.seqs.setdefault(seq, []).append((t, clock))
            clock += 1
        return clock

    def occurrences(self, path):
        out = []
        for s in self.seqs.values():
            for j in range(len(s) - len(path) + 1):
                if [t for t, _ in s[j: j + len(path)]] == list(path):
                    out.append(s[j + len(path) - 1][1] if path else 0)
        return out

    def match(self, pattern):
        return tuple(pattern) if self.occurrences(pattern) and len(pattern) <= self.max_depth else None

    def count(self, node):
        if not node:
            return sum(len(s) for s in self.seqs.values())
        return len(self.occurrences(node))

    def children(self, node):
        if len(node) >= self.max_depth:
            return []
        vocab = {t for s in self.seqs.values() for t, _ in s}
        kids = [(t, self.occurrences(node + (t,))) for t in vocab]
        kids = [(t, len(o), min(o)) for t, o in kids if o]
        return [(t, c, node + (t,)) for t, c, _ in sorted(kids, key=lambda x: (-x[1], x[2]))]

    def head(self, node):
        kids = self.children(node)
        return kids[0] if kids else None

    def paths(self):
        out, frontier = {}, [()]
        while frontier:
            p = frontier.pop()
            for t, c, child in self.children(p):
                out[child] = c
                frontier.append(child)
        return out


def brute_chain(b: Brute, context, k, factor, min_prob):
    """Arctic Inference's speculate, spelled out directly over the brute-force counts."""
    context = list(context)[-b.max_depth:]
    best = ([], 0.0, 0)
    for m in range(1, len(context)):
        node = tuple(context[-m:])
        if not b.occurrences(node):
            break
        n_max = max(0, min(k, int(float(np.float32(m) * np.float32(factor)) + 1e-6)))
        toks, prob, score = [], np.float32(1), np.float32(0)
        while len(toks) < n_max and b.children(node):
            t, c, child = b.children(node)[0]
            if c != b.count(node):
                prob = np.float32(prob * np.float32(np.float32(c) / np.float32(b.count(node))))
            if prob < np.float32(min_prob):
                break
            toks.append(t)
            score = np.float32(score + prob)
            node = child
        if float(score) >= best[1]:
            best = (toks, float(score), m)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_trie_and_corpus_index_equal_brute_force(seed):
    rng = random.Random(seed)
    depth, vocab = rng.randint(2, 6), rng.randint(2, 5)
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 4))]
    trie, brute, clock = SuffixTree(depth), Brute(depth), 0
    for i, s in enumerate(seqs):  # sequences grown in pieces, interleaved, as rows of a batch are
        cut = rng.randint(0, len(s))
        trie.extend(i, s[:cut])
        clock = brute.add(i, s[:cut], clock)
    for i, s in enumerate(seqs):
        cut = len(brute.seqs.get(i, []))
        trie.extend(i, s[cut:])
        clock = brute.add(i, s[cut:], clock)
    assert trie.paths() == brute.paths()
    docs = np.concatenate([np.array(s + [-1], dtype=np.int32) for s in seqs])
    corpus = CorpusSuffixIndex(docs, depth, max_scan=1 << 20)
    in_order, clock = Brute(depth), 0  # a corpus is its documents one after another: first occurrences by position
    for i, s in enumerate(seqs):
        clock = in_order.add(i, s, clock)
    assert {p: CorpusSuffixIndex.count(corpus.match(list(p))) for p in brute.paths()} == brute.paths()
    for _ in range(20):
        ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        k, factor, min_prob = rng.randint(1, 8), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.3])
        for src, ref in ((trie, brute), (corpus, in_order)):
            want = brute_chain(ref, ctx, k, factor, min_prob)
            d = speculate(src, ctx, k, factor, 0.0, min_prob)
            assert (d.tokens, d.score, d.match_len) == (want[0], pytest.approx(want[1]), want[2]), (seed, ctx)
    for src, ref in ((trie, brute), (corpus, in_order)):
        for p in ref.paths():  # every node's siblings in the same order with the same counts
            node = src.match(list(p))
            assert [(t, c) for t, c, _ in src.children(node)] == [(t, c) for t, c, _ in ref.children(p)]
    gone = rng.randrange(len(seqs))  # FIFO eviction from the global tree: the counts it held go with it
    trie.remove(gone)
    del brute.seqs[gone]
    assert trie.paths() == brute.paths()


def test_corpus_index_sampled_ranges_keep_exact_counts():
    rng = np.random.default_rng(0)
    docs = np.concatenate([np.append(rng.integers(0, 3, 400), -1) for _ in range(5)]).astype(np.int32)
    exact, sampled = CorpusSuffixIndex(docs, 6, max_scan=1 << 20), CorpusSuffixIndex(docs, 6, max_scan=16)
    node = exact.match([1])
    kids_e, kids_s = exact.children(node), sampled.children(sampled.match([1]))
    assert {t: c for t, c, _ in kids_s} == {t: c for t, c, _ in kids_e}  # a wide range: counts still exact


@pytest.mark.parametrize("seed", range(3))
def test_corpus_index_fast_paths_equal_the_one_by_one_search(seed):
    rng = np.random.default_rng(seed)
    docs = np.concatenate([np.append(rng.integers(0, 4, rng.integers(1, 300)), -1) for _ in range(6)]).astype(np.int32)
    exact = CorpusSuffixIndex(docs, 5, max_scan=1 << 20)
    sampled = CorpusSuffixIndex(docs, 5, max_scan=8)
    sampled.cache_nodes = 3
    for _ in range(30):  # every suffix of a context, matched together, equals matching each alone
        ctx = rng.integers(0, 5, rng.integers(1, 9)).tolist()
        assert exact.match_suffixes(ctx) == [exact.match(ctx[-m:]) for m in range(1, min(len(ctx), 5) + 1)]
    for node in [exact.match([t]) for t in range(4)] + [exact.match([t, u]) for t in range(4) for u in range(4)]:
        if node is None:
            continue
        # a sampled range finds the children it sees with the full scan's ranges and counts (it may miss rare ones)
        kids = sampled.children(node)
        assert kids and set(kids) <= set(exact.children(node))
        assert len(sampled._kids) <= 3  # the kept children lists stay bounded


@pytest.mark.parametrize("knob,value,words", [("max_tree_depth", 0, "max_tree_depth must be an int >= 1"),
                                              ("max_cached_requests", -1, "max_cached_requests must be an int >= 0"),
                                              ("max_spec_factor", -0.5, "max_spec_factor must be a number >= 0"),
                                              ("min_token_prob", 1.5, "min_token_prob must be a number in [0, 1]"),
                                              ("max_spec_offset", float("nan"), "max_spec_offset must be a finite"),
                                              ("max_tree_depth", 2.5, "max_tree_depth must be an int >= 1")])
def test_bad_knobs_are_refused_with_one_line(knob, value, words):
    with pytest.raises(ValueError, match=re.escape(words)) as exc:
        SuffixConfig(**{knob: value})
    assert "\n" not in str(exc.value)


def _state(rows, stable=None):
    return DecodeState(tokens=[list(r) for r in rows], num_stable=stable or [0] * len(rows), features=None,
                       active=[True] * len(rows), vocab_size=64)


def test_drafts_grow_with_the_match_and_use_the_outputs_of_earlier_requests():
    d = SuffixDrafter()
    d.reset(1)
    rows = [[1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3, 4, 5, 6]]
    prop = d.propose(_state(rows), 8, SamplingParams(), None)
    # "1 2 3 4 5 6" matched: the prompt's continuation 7 9 1 ... up to the 6 tokens the match earns (factor 1)
    assert prop.lengths.tolist() == [6] and prop.tokens[0, :6].tolist() == [7, 9, 1, 2, 3, 4]
    d.reset(1)  # a new request: its prompt never saw 40 41 ..., but the first request's output did
    first = [[30, 40, 41, 42, 43, 44]]
    d.propose(_state([first[0][:2]]), 4, SamplingParams(), None)  # prompt [30], output 40 41 42 43 44
    d.propose(_state(first, [2]), 4, SamplingParams(), None)
    d.reset(1)
    prop = d.propose(_state([[50, 40, 41, 42]]), 4, SamplingParams(), None)
    assert prop.tokens[0, : prop.lengths[0]].tolist() == [43, 44] and d.source_rows["outputs"] == 1
    none = SuffixDrafter(SuffixConfig(max_cached_requests=0))
    none.reset(1)
    none.propose(_state([first[0][:2]]), 4, SamplingParams(), None)
    none.propose(_state(first, [2]), 4, SamplingParams(), None)
    none.reset(1)
    assert none.propose(_state([[50, 40, 41, 42]]), 4, SamplingParams(), None).lengths.tolist() == [0]


def test_outputs_are_evicted_fifo_beyond_max_cached_requests():
    d = SuffixDrafter(SuffixConfig(max_cached_requests=2))
    for i in range(4):
        d.reset(1)
        d.propose(_state([[60 + i, 1, 2]]), 2, SamplingParams(), None)
    assert d.outputs.sequences == [2, 3]


def test_corpus_drafts_where_the_row_has_no_match():
    docs = np.array([5, 6, 7, 8, 9, -1, 5, 6, 7, 8, 10, -1], dtype=np.int32)
    d = SuffixDrafter(SuffixConfig(max_cached_requests=0), corpus=CorpusSuffixIndex(docs, 24))
    d.reset(1)
    prop = d.propose(_state([[1, 5, 6, 7]]), 5, SamplingParams(), None)
    assert prop.tokens[0, : prop.lengths[0]].tolist() == [8, 9] and d.source_rows["corpus"] == 1  # 9: first seen
    with pytest.raises(ValueError, match="depth 24, the drafter's max_tree_depth is 8"):
        SuffixDrafter(SuffixConfig(max_tree_depth=8), corpus=CorpusSuffixIndex(docs, 24))


PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [20, 21], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1]]  # ragged


@pytest.mark.parametrize("tree", [None, "3,2,1", "dynamic:8:3:2"])
@pytest.mark.parametrize("behind", [False, True])
def test_greedy_output_equals_plain_decoding(tree, behind):
    from test_drafters_conformance import build

    target = tiny_llama(0)
    suffix = SuffixDrafter()
    drafter = SuffixHybrid(build("eagle3", target), suffix, min_score=1.0) if behind else suffix
    plain = generate(target, PROMPTS, max_new_tokens=24, eos_token_id=[])
    for _ in range(1 if behind or tree else 2):  # a second call also drafts from the first call's outputs
        res = generate(target, PROMPTS, drafter=drafter, max_new_tokens=24, num_draft_tokens=4, tree=tree,
                       eos_token_id=[])
        assert res.sequences == plain.sequences
    assert res.stats.accepted > 0
    if behind:
        assert drafter.lookup_rows > 0 and drafter.drafter_rows > 0  # both sources drafted


V, PROMPT, RUNS = 16, [1, 5, 9], 3000


@pytest.mark.parametrize("behind,tree", [(False, None), (True, None), (False, "2,1")])
def test_first_tokens_follow_target_distribution(behind, tree):
    """Temperature 1 (tests/test_decode_distribution.py's chi-square over the exact joint law of three tokens)."""
    from drafterkit.drafters.draft_lm import DraftLM
    from test_decode_distribution import _chi2, _exact_joint

    target = tiny_llama(0, vocab_size=V)
    suffix = SuffixDrafter(SuffixConfig(max_cached_requests=0, min_token_prob=0.0))
    drafter = SuffixHybrid(DraftLM.from_model(tiny_llama(3, vocab_size=V, layers=1)), suffix) if behind else suffix
    prompt = PROMPT + list(range(V)) + PROMPT  # "1 5 9" occurred before: the suffix tree drafts its continuation
    res = generate(target, [prompt] * RUNS, drafter=drafter, max_new_tokens=3, num_draft_tokens=5, tree=tree,
                   temperature=1.0, seed=1234, eos_token_id=[])
    seqs = torch.tensor(res.sequences)
    joint = _exact_joint(target, SamplingParams(1.0), prompt)
    c12 = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    assert _chi2(c12, joint.sum(2).flatten()) > 1e-3
    for pos, marg in ((1, joint.sum((0, 2))), (2, joint.sum((0, 1)))):
        assert _chi2(torch.bincount(seqs[:, pos], minlength=V).double(), marg) > 1e-3
    assert res.stats.drafted > 0 and 0 < res.stats.accepted


def test_hybrid_takes_the_suffix_draft_only_when_it_scores_at_least_the_draft_length():
    from drafterkit.drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    # row 0's suffix draft: 7 8 9, each of probability 1/2 (the row's own "1 .. 6" counts too): score 1.5
    rows = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6], [30, 31]]
    alone = DraftLM.from_target(target, 1)
    alone.reset(2)
    own = alone.propose(_state(rows), 3, SamplingParams(), None).tokens
    for bar, row0 in ((1.0, [7, 8, 9]), (None, own[0].tolist())):  # None: the bar is k = 3, above 1.5
        hybrid = SuffixHybrid(DraftLM.from_target(target, 1), min_score=bar)
        hybrid.reset(2)
        prop = hybrid.propose(_state(rows), 3, SamplingParams(), None)
        assert prop.tokens[0].tolist() == row0 and prop.tokens[1].tolist() == own[1].tolist()
        assert hybrid.lookup_rows == (1 if bar else 0)
    with pytest.raises(ValueError, match="min_score must be a finite number >= 0"):
        SuffixHybrid(DraftLM.from_target(target, 1), min_score=-1)
