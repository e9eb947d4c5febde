"""EAGLE-2 dynamic trees: the spec, the expansion and reranking against a hand-computed example, the
node budget, exact greedy output for every drafter kind and exact sampling (chi-square)."""

import math

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import generate
from drafterkit.decode.dynamic_tree import DynamicTree, TreeBuilder, merge_scored, parse_tree
from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.tree import DraftTree

ROWS = [[5, 6, 7, 8, 9, 5, 6], [10, 11], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7], [9]]
N = 24


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def greedy_ref(target):
    return generate(target, ROWS, max_new_tokens=N, eos_token_id=[]).sequences


# --- the spec ------------------------------------------------------------------------------------------


def test_dynamic_specs_parse_and_print():
    assert DynamicTree.parse("dynamic") == DynamicTree()
    assert DynamicTree.parse("dynamic:10") == DynamicTree(10)
    assert DynamicTree.parse(" dynamic:10:3:2 ") == DynamicTree(10, 3, 2)
    assert str(DynamicTree(10, 3, 2)) == "dynamic:10:3:2" and DynamicTree(10, 3, 2).max_depth == 3
    assert isinstance(parse_tree("dynamic:8"), DynamicTree) and isinstance(parse_tree("3,2"), DraftTree)
    assert DynamicTree(10, 5, 2).capped(2) == DynamicTree(10, 2, 2)


@pytest.mark.parametrize("spec,match", [("dynamic:0", "total must be an int"), ("dynamic:8:0", "depth must be"),
                                        ("dynamic:a", "must be integers"), ("dynamic:1:2:3:4", "spell it"),
                                        ("dynamic:", "spell it"), ("dynamics", "spell it"),
                                        ("dynamic:5000", r"total must be an int in \[1, 1024\]")])
def test_bad_dynamic_specs_name_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_tree(spec)


# --- expansion and reranking ---------------------------------------------------------------------------


def _logp(rows):
    return torch.tensor(rows, dtype=torch.float64).log()


def _grow(total, min_prob=0.0):
    """Top-2 expansion over 3 levels of a 5-token vocabulary, probabilities chosen by hand (see test)."""
    b = TreeBuilder(DynamicTree(total, 3, 2), min_prob=min_prob)
    f1 = b.add_children(_logp([[0.6, 0.3, 0.05, 0.03, 0.02]]))
    f2 = b.add_children(_logp([[0.0, 0.1, 0.7, 0.2, 0.0],  # after token 0: 2 (.42), 3 (.12)
                               [0.8, 0.1, 0.05, 0.05, 0.0]][: len(f1)]))  # after token 1: 0 (.24), 1 (.03)
    f3 = b.add_children(_logp([[0.3, 0.1, 0.05, 0.05, 0.5],  # after 0,2: 4 (.21), 0 (.126)
                               [0.0, 0.0, 0.6, 0.4, 0.0]][: len(f2)]))  # after 1,0: 2 (.144), 3 (.096)
    return b, f1, f2, f3


def test_expansion_follows_cumulative_log_probability_and_reranking_keeps_the_budget():
    b, f1, f2, f3 = _grow(5)
    # level 1: both children of the root; level 2: the best two of its four nodes, (0,2) .42 and (1,0) .24
    assert f1 == [0, 1] and [b.tokens[i] for i in f2] == [2, 0] and [b.parents[i] for i in f2] == [0, 1]
    assert f3 == [] and len(b.tokens) == 10  # 2 + 4 + 4 drafted, the last level not expanded
    # all ten ranked: .6 .42 .3 .24 .21 | .144 .126 .12 .096 .03 -> the best five form the tree
    row = b.result()
    assert row.tree.paths == ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))
    assert row.tokens == [0, 1, 2, 0, 4]
    assert [round(math.exp(s), 6) for s in row.scores] == [0.6, 0.3, 0.42, 0.24, 0.21]
    row7 = _grow(7)[0].result()
    assert row7.tree.paths[5:] == ((0, 0, 1), (1, 0, 0)) and row7.tokens[5:] == [0, 2]
    # a confidence bar drops candidates below it: only nodes of path probability >= 0.2 are drafted
    assert _grow(20, min_prob=0.2)[0].result().tokens == [0, 1, 2, 0, 4]


def test_merged_branches_rank_with_the_drafter_nodes():
    row = _grow(3)[0].result()  # tokens 0 (.6), 1 (.3), 0->2 (.42)
    merged = merge_scored([row], {(7,): math.log(0.5), (7, 8): math.log(0.45), (0,): math.log(0.9)}, 4)
    tok_paths = {}
    for i, (p, t) in enumerate(zip(merged.tree.parents, merged.tokens)):
        tok_paths[i] = (tok_paths[p] if p >= 0 else ()) + (t,)
    # (0,) takes the higher score .9; kept: 0 (.9), 7 (.5), 7->8 (.45), 0->2 (.42); token 1 (.3) drops
    assert set(tok_paths.values()) == {(0,), (7,), (7, 8), (0, 2)}
    assert merged.tree.paths[:2] == ((0,), (1,)) and merged.tokens[:2] == [0, 7]  # siblings ranked by score


# --- decoding ------------------------------------------------------------------------------------------


class _Recording:
    """Wraps a drafter and records every row tree it proposes."""

    def __init__(self, inner):
        self.inner, self.trees = inner, []
        self.feature_layers = inner.feature_layers

    def check_compatible(self, target, vocab_size):
        self.inner.check_compatible(target, vocab_size)

    def reset(self, batch_size):
        self.inner.reset(batch_size)

    def propose(self, *a):
        return self.inner.propose(*a)

    def propose_dynamic_tree(self, state, spec, sampling, generator):
        prop = self.inner.propose_dynamic_tree(state, spec, sampling, generator)
        self.trees += [t for t in prop.trees if t is not None]
        return prop


def _build(kind, target):
    from test_drafters_conformance import build

    from drafterkit.drafters.lookup.hybrid import LookupHybrid

    if kind == "eagle3+ngram":
        return LookupHybrid(build("eagle3", target))
    return build(kind, target)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "draft_lm", "ngram", "eagle3+ngram"])
@pytest.mark.parametrize("spec", ["dynamic:6:3:2", "dynamic"])
def test_dynamic_trees_are_exact_in_a_ragged_batch_and_respect_the_budget(target, greedy_ref, kind, spec):
    rec = _Recording(_build(kind, target))
    res = generate(target, ROWS, drafter=rec, tree=spec, max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    single = generate(target, ROWS[2:3], drafter=rec, tree=spec, max_new_tokens=N, eos_token_id=[])
    assert single.sequences[0] == greedy_ref[2]
    dyn = DynamicTree.parse(spec)
    assert rec.trees and res.stats.drafted > 0
    for t in rec.trees:
        assert t.num_nodes <= dyn.total and t.max_depth <= dyn.depth
        assert all(len(kids) <= dyn.topk for kids in t.children.values())
    assert res.stats.drafted <= dyn.total * res.stats.target_forwards


def test_the_target_as_its_own_draft_model_has_every_depth_accepted(target, greedy_ref):
    """A draft LM equal to the target: its best path is the target's greedy continuation and always kept
    (it scores highest at every depth), so every verified depth is accepted: this checks the draft
    model's per-row tree masks and positions over a ragged batch."""
    from drafterkit.drafters.draft_lm import DraftLM

    res = generate(target, ROWS, drafter=DraftLM.from_model(target), tree="dynamic:8:3:2", max_new_tokens=N,
                   eos_token_id=[])
    assert res.sequences == greedy_ref
    assert res.stats.accept_per_position == [1.0] * 3


def test_a_drafter_without_dynamic_trees_is_refused(target):
    from test_decode_tree import ScriptedTree

    with pytest.raises(ValueError, match="grows its tree"):
        generate(target, ROWS, drafter=ScriptedTree(ROWS, [[0] * N] * 4), tree="dynamic", max_new_tokens=4)


@pytest.mark.parametrize("params,kind", [(SamplingParams(1.0), "medusa"), (SamplingParams(1.0), "eagle+ngram"),
                                         (SamplingParams(0.7, 0, 0.9), "draft_lm"),
                                         (SamplingParams(0.7, 0, 0.9), "ngram")],
                         ids=["t1-medusa", "t1-hybrid", "t07_p09-draft_lm", "t07_p09-ngram"])
def test_dynamic_tree_tokens_follow_target_distribution(params, kind):
    """Dynamic trees at temperature > 0: the first three committed tokens keep the target's joint law."""
    from test_decode_distribution import PROMPT, RUNS, V, _chi2, _exact_joint
    from test_drafters_conformance import build

    from drafterkit.drafters.lookup.hybrid import LookupHybrid

    target = tiny_llama(0, vocab_size=V)
    drafter = build(kind.split("+")[0], target)
    prompt = PROMPT
    if kind == "ngram":  # every id follows the prompt's last token somewhere: a wide lookup trie
        prompt = [t for a in range(V) for t in (PROMPT[-1], a)] + PROMPT
    if kind.endswith("+ngram"):
        drafter, prompt = LookupHybrid(drafter), PROMPT + list(range(V)) + PROMPT
    res = generate(target, [prompt] * RUNS, drafter=drafter, tree="dynamic:6:2:3", max_new_tokens=3,
                   temperature=params.temperature, top_p=params.top_p, seed=99, eos_token_id=[])
    seqs = torch.tensor(res.sequences)
    joint = _exact_joint(target, params, prompt)
    c12 = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    assert _chi2(c12, joint.sum(2).flatten()) > 1e-3
    c23 = torch.bincount(seqs[:, 1] * V + seqs[:, 2], minlength=V * V).double()
    assert _chi2(c23, joint.sum(0).flatten()) > 1e-3
    assert 0 < res.stats.accepted
