"""Tree drafts: the DraftTree spec, tree verification (greedy and exact sampling), and decode.generate
with a tree: exact output, the accepted path's cache columns moved into place, stats per depth."""

import pytest
import torch
from conftest import tiny_llama
from scipy import stats

from drafterkit.decode import generate
from drafterkit.decode.decoder import watch_rounds
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.decode.tree import DraftTree, close_under_parents
from drafterkit.decode.verify import verify_tree_greedy, verify_tree_sampling

ROWS = [[5, 6, 7, 8, 9, 5, 6], [10, 11], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7], [9]]
N = 24


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def greedy_ref(target):
    return generate(target, ROWS, max_new_tokens=N, eos_token_id=[]).sequences


# --- the tree spec -------------------------------------------------------------------------------------

def test_parse_widths_paths_and_json_agree():
    t = DraftTree.parse("2,2")
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert t.parents == (-1, -1, 0, 0, 1, 1) and t.depths == (1, 1, 2, 2, 2, 2) and t.ranks == (0, 1, 0, 1, 0, 1)
    assert DraftTree.parse([[1, 1], [0], [1], [0, 0], [0, 1], [1, 0], [0]]) == t  # sorted, deduplicated
    assert DraftTree.parse("[[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]") == t
    assert DraftTree.parse(t) is t
    assert t.children[-1] == (0, 1) and t.children[0] == (2, 3) and t.children[2] == ()
    assert t.spine() == [0, 2] and t.num_nodes == 6 and t.max_depth == 2
    assert DraftTree.parse("3,2,1").num_nodes == 3 + 6 + 6
    assert DraftTree.chain(4).paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))


def test_attention_mask_is_ancestor_or_self():
    t = DraftTree.parse([[0], [1], [0, 0], [1, 0]])
    m = t.attention_mask()
    want = torch.tensor([[1, 0, 0, 0, 0],   # root
                         [1, 1, 0, 0, 0],   # (0,)
                         [1, 0, 1, 0, 0],   # (1,)
                         [1, 1, 0, 1, 0],   # (0, 0)
                         [1, 0, 1, 0, 1]],  # (1, 0)
                        dtype=torch.bool)
    assert torch.equal(m, want)


@pytest.mark.parametrize("spec,match", [
    ("", "branching factors"), ("3,0", ">= 1"), ("a,b", "branching factors"), ("[[0], [1", "not valid JSON"),
    ([], "at least one node"), ([[0, 1]], "no parent"), ([[-1]], ">= 0"), (5, "DraftTree"), ([[]], "at least one"),
    ("9000", "too big"), ("8,8,8,8", "too big"), ([0, 1], "list of ranks"), ([[True]], "integer ranks"),
    ('[["a"]]', "integer ranks"),
])
def test_bad_tree_specs_name_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        DraftTree.parse(spec)


def test_subtree_and_close_under_parents():
    t = DraftTree.parse("2,2")
    valid = close_under_parents(t, torch.tensor([[False, True, True, True, True, False]]))
    assert valid.tolist() == [[False, True, False, False, True, False]]
    sub, idx = t.subtree(valid[0].tolist())
    assert idx == [1, 4] and sub.paths == ((1,), (1, 0)) and sub.parents == (-1, 0)
    with pytest.raises(ValueError, match="closed under parents"):
        t.subtree([False, False, True, False, False, False])


# --- verification --------------------------------------------------------------------------------------

def test_verify_tree_greedy_follows_the_agreeing_branch():
    t = DraftTree.parse([[0], [1], [1, 0], [1, 1]])
    v = 8
    logits = torch.zeros(1, 5, v)
    logits[0, 0, 4] = 1  # root: target says 4 -> node (1,) holds 4
    logits[0, 2, 6] = 1  # after (1,): target says 6 -> node (1, 1) holds 6
    logits[0, 4, 7] = 1  # after (1, 1): bonus 7
    draft = torch.tensor([[3, 4, 5, 6]])
    paths, nxt = verify_tree_greedy(logits, t, draft)
    assert paths == [[1, 3]] and nxt == [7]
    paths, nxt = verify_tree_greedy(logits, t, draft, valid=torch.tensor([[True, True, True, False]]))
    assert paths == [[1]] and nxt == [6]  # the agreeing node is masked: correction token 6
    with pytest.raises(ValueError, match="tree of N=4"):
        verify_tree_greedy(logits[:, :3], t, draft)


def test_verify_tree_sampling_first_token_is_exact():
    """Three deterministic candidates at the root, many independent rows: the committed first token
    follows p whatever the candidates are (chi-square), including a candidate of probability 0."""
    g = torch.Generator().manual_seed(0)
    t = DraftTree.parse("3")
    p_root = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.3])
    rows = 20000
    p = p_root.expand(rows, 4, 5).clone()
    draft = torch.tensor([[1, 2, 4]]).expand(rows, 3)
    paths, nxt = verify_tree_sampling(p, t, draft, generator=g)
    first = torch.tensor([draft[0, pth[0]].item() if pth else n for pth, n in zip(paths, nxt)])
    counts = torch.bincount(first, minlength=5).double()
    assert counts[2] == 0
    keep = p_root > 0
    exp = p_root[keep].double() / p_root[keep].double().sum() * counts[keep].sum()
    assert stats.chisquare(counts[keep], exp).pvalue > 1e-3
    # acceptance at the root = P(first token is one of the candidates) = 0.4 + 0 + 0.3
    assert abs(sum(1 for pth in paths if pth) / rows - 0.7) < 0.02


# --- generate with a tree ------------------------------------------------------------------------------

class ScriptedTree:
    """Puts the true greedy continuation on one path of the tree (which path cycles round by round) and
    wrong tokens on every other node, so the accepted depth is known in advance."""

    feature_layers = None

    def __init__(self, prompts, ref):
        self.prompts, self.ref, self.calls, self.expected = prompts, ref, 0, []

    def check_compatible(self, target, vocab_size):
        pass

    def reset(self, batch_size):
        self.calls, self.expected = 0, []

    def propose(self, state, k, sampling, generator):
        raise AssertionError("tree mode must call propose_tree")

    def propose_tree(self, state, tree, sampling, generator):
        leaves = [i for i in range(tree.num_nodes) if not tree.children[i]]
        true_leaf = leaves[self.calls % len(leaves)]
        self.calls += 1
        true_path = tree.paths[true_leaf]
        rows = []
        for b, toks in enumerate(state.tokens):
            done = len(toks) - len(self.prompts[b])
            true = (self.ref[b] + [0] * 16)[done: done + tree.max_depth]
            rows.append([true[len(p) - 1] if p == true_path[: len(p)] else (true[len(p) - 1] + 1 + p[-1]) % 128
                         for p in tree.paths])
        self.expected.append(len(true_path))
        return Proposal(torch.tensor(rows))


@pytest.mark.parametrize("spec", ["3,2,1", "[[0], [1], [2], [1, 0], [1, 1], [1, 1, 0], [2, 0]]", "1,1,1,1"])
def test_scripted_tree_output_is_exact_and_the_cache_stays_consistent(target, greedy_ref, spec):
    prop = ScriptedTree(ROWS, greedy_ref)

    def check(info):
        assert info.cache_length == info.mask_length
        for b, a in enumerate(info.active):
            if a:
                assert info.valid_columns[b] == info.n_real[b] == len(info.tokens[b]) - 1

    with watch_rounds(check):
        res = generate(target, ROWS, drafter=prop, tree=spec, max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    tree = DraftTree.parse(spec)
    # every row follows the same schedule: round r accepts the scripted depth, capped by the budget
    rem, accepted, drafted, rounds = N - 1, 0, 0, 0
    while rem > 0:
        cap = min(tree.max_depth, rem - 1)
        acc = min(prop.expected[rounds], cap) if cap else 0
        drafted += sum(d <= cap for d in tree.depths)
        accepted, rem, rounds = accepted + acc, rem - acc - 1, rounds + 1
    s = res.stats
    assert s.committed == 4 * N and s.accepted == 4 * accepted and s.drafted == 4 * drafted
    assert s.target_forwards == 4 * rounds and s.tau == pytest.approx((N - 1) / rounds)
    assert s.accept_per_position[0] == 1.0  # the true first token is always in the tree


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "draft_lm", "ngram"])
@pytest.mark.parametrize("spec", ["3,2,1", "[[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0]]"])
def test_drafter_trees_are_exact_in_a_ragged_batch(target, greedy_ref, kind, spec):
    from test_drafters_conformance import build

    drafter = build(kind, target)
    res = generate(target, ROWS, drafter=drafter, tree=spec, max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    single = generate(target, ROWS[2:3], drafter=drafter, tree=spec, max_new_tokens=N, eos_token_id=[])
    assert single.sequences[0] == greedy_ref[2]


def test_hybrid_tree_is_exact_in_a_batch_and_alone(target, greedy_ref):
    from test_drafters_conformance import build

    from drafterkit.drafters.lookup.hybrid import LookupHybrid

    hyb = LookupHybrid(build("eagle3", target))
    res = generate(target, ROWS, drafter=hyb, tree="3,2,1", max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    assert hyb.lookup_rows > 0 and hyb.drafter_rows > 0
    alone = generate(target, ROWS[2:3], drafter=hyb, tree="3,2,1", max_new_tokens=N, eos_token_id=[])
    assert alone.sequences[0] == greedy_ref[2] and hyb.lookup_rows > 0
    from test_decode_engine import _Fixed

    chain_only = _Fixed(lambda state, k: torch.zeros(len(state.tokens), k, dtype=torch.long))  # no propose_tree
    with pytest.raises(ValueError, match="chains only"):
        generate(target, ROWS, drafter=LookupHybrid(chain_only), tree="2", max_new_tokens=4)


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_draft_threshold_prunes_tree_nodes_exactly(target, greedy_ref, kind):
    from test_drafters_conformance import build

    drafter = build(kind, target)
    full = generate(target, ROWS, drafter=drafter, tree="3,2,2", max_new_tokens=N, eos_token_id=[])
    drafter.draft_threshold = 0.05
    pruned = generate(target, ROWS, drafter=drafter, tree="3,2,2", max_new_tokens=N, eos_token_id=[])
    drafter.draft_threshold = 0.0
    assert full.sequences == pruned.sequences == greedy_ref
    assert pruned.stats.drafted < full.stats.drafted


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft_lm"])
def test_expand_threshold_leaves_low_nodes_childless_and_stays_exact(target, greedy_ref, kind):
    from test_drafters_conformance import build

    drafter = build(kind, target)
    tree = DraftTree.parse("3,2,2")
    drafter.expand_threshold = 1.01  # no node clears it: every proposed node is a depth-1 leaf
    res = generate(target, ROWS, drafter=drafter, tree=tree, max_new_tokens=N, eos_token_id=[])
    leaves_only = res.stats
    drafter.reset(1)  # one proposal by hand: only depth-1 nodes
    state_tokens = [list(ROWS[0]) + greedy_ref[0][:3]]
    feats = None
    if getattr(drafter, "feature_layers", None) is not None:
        feats = [torch.zeros(len(state_tokens[0]) - 1, target.config.hidden_size * len(drafter.feature_layers))]
    prop = drafter.propose_tree(DecodeState(tokens=state_tokens, num_stable=[0], features=feats, active=[True],
                                            vocab_size=target.config.vocab_size), tree, SamplingParams(), None)
    depths = torch.tensor(tree.depths)
    mask = torch.as_tensor(prop.mask)[0]
    assert bool(mask[depths == 1].any()) and not bool(mask[depths > 1].any())
    drafter.expand_threshold = 0.0
    assert res.sequences == greedy_ref
    full = generate(target, ROWS, drafter=drafter, tree=tree, max_new_tokens=N, eos_token_id=[]).stats
    assert leaves_only.drafted < full.drafted


def test_out_of_vocab_tree_nodes_are_dropped_and_warned(target, greedy_ref):
    class Bad(ScriptedTree):
        def propose_tree(self, state, tree, sampling, generator):
            prop = super().propose_tree(state, tree, sampling, generator)
            prop.tokens[:, 1] = 10 ** 6  # node (1,) and its subtree become unusable
            return prop

    with pytest.warns(UserWarning, match="outside"):
        res = generate(target, ROWS, drafter=Bad(ROWS, greedy_ref), tree="2,1", max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref


def test_tree_sampling_is_reproducible_and_stops_at_eos(target):
    from test_drafters_conformance import build

    drafter = build("medusa", target)
    a = generate(target, ROWS, drafter=drafter, tree="2,2", max_new_tokens=N, temperature=1.0, seed=7)
    b = generate(target, ROWS, drafter=drafter, tree="2,2", max_new_tokens=N, temperature=1.0, seed=7)
    assert a.sequences == b.sequences
    for seq, why in zip(a.sequences, a.finish_reasons):
        assert len(seq) <= N and (why == "length") == (2 not in seq)
        if 2 in seq:
            assert seq.index(2) == len(seq) - 1


@pytest.mark.parametrize("spec", ["2,2,1", "1,1,1,1"])
def test_the_target_as_its_own_draft_model_has_every_rank0_path_accepted(target, greedy_ref, spec):
    """A draft LM identical to the target drafts the tree in its own cache under tree attention: its
    rank-0 path is the target's greedy continuation, so every depth is accepted (cache bookkeeping of
    the draft side checked by the outcome)."""
    from drafterkit.drafters.draft_lm import DraftLM

    res = generate(target, ROWS, drafter=DraftLM.from_model(target), tree=spec, max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    depth = DraftTree.parse(spec).max_depth
    assert res.stats.accept_per_position == [1.0] * depth
    full, rem = divmod(N - 1, depth + 1)
    assert res.stats.target_forwards == 4 * (full + (1 if rem else 0))


def test_a_rank_past_the_vocabulary_is_refused_before_generating(target):
    from test_drafters_conformance import build

    with pytest.raises(ValueError, match="more candidates than the vocabulary"):
        # ranks 0..128 at depth 1: one past the tiny target's 128-token vocabulary
        generate(target, ROWS, drafter=build("medusa", target), tree="129", max_new_tokens=4)


@pytest.mark.parametrize("spec", ["[[1]]", "[[0], [0, 1]]", [[0], [2]]])
def test_a_tree_skipping_a_better_ranked_sibling_is_refused(spec):
    """[1] without [0] would draft the second-best token and never the best: a typo, refused with the rule."""
    with pytest.raises(ValueError, match="skip a better-ranked sibling"):
        DraftTree.parse(spec)
