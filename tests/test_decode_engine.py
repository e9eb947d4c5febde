"""decode.generate on tiny seeded models: greedy equivalence, cache invariants, stop handling, stats."""

import warnings

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import generate
from drafterkit.decode.decoder import watch_rounds
from drafterkit.decode.protocol import Proposal
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.ngram import NGramDrafter

ROWS = [[5, 6, 7, 8, 9, 5, 6], [10, 11], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7], [9]]
N = 24


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def greedy_ref(target):
    """transformers' own greedy decoding, one row at a time."""
    out = []
    for r in ROWS:
        g = target.generate(torch.tensor([r]), max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(g[0, len(r):].tolist())
    return out


class Scripted:
    """Proposes the true greedy continuation for the first j tokens, then wrong ones; j cycles 0..K."""

    feature_layers = None

    def __init__(self, prompts, ref, k):
        self.prompts, self.ref, self.k, self.calls = prompts, ref, k, 0
        self.right: list[list[int]] = []

    def check_compatible(self, target, vocab_size):
        pass

    def reset(self, batch_size):
        self.calls, self.right = 0, []

    def propose(self, state, k, sampling, generator):
        j = self.calls % (self.k + 1)
        self.calls += 1
        rows = []
        for b, toks in enumerate(state.tokens):
            done = len(toks) - len(self.prompts[b])
            true = (self.ref[b] + [0] * (k + 1))[done: done + k]
            rows.append([t if i < j else (t + 1) % 128 for i, t in enumerate(true)])
        self.right.append(min(j, k))
        return Proposal(torch.tensor(rows), None)


def test_plain_greedy_equals_transformers(target, greedy_ref):
    res = generate(target, ROWS, max_new_tokens=N, eos_token_id=[])
    assert res.sequences == greedy_ref
    assert res.finish_reasons == ["length"] * 4
    s = res.stats
    assert s.tau == 1.0 and s.committed == 4 * N and s.target_forwards == 4 * (N - 1) and s.drafted == 0


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("kind", ["self", "random", "ngram", "truncated"])
def test_greedy_equivalence_ragged_batch(target, greedy_ref, k, kind):
    drafter = {"self": lambda: target, "random": lambda: tiny_llama(1, layers=1),
               "ngram": lambda: NGramDrafter(), "truncated": lambda: DraftLM.from_target(target, 1)}[kind]()
    res = generate(target, ROWS, drafter=drafter, max_new_tokens=N, num_draft_tokens=k, eos_token_id=[])
    assert res.sequences == greedy_ref
    singles = [generate(target, [row], drafter=drafter, max_new_tokens=N, num_draft_tokens=k, eos_token_id=[])
               for row in (ROWS if k == 3 else ROWS[1:2])]  # each row equals its own B=1 run
    assert [one.sequences[0] for one in singles] == (res.sequences if k == 3 else res.sequences[1:2])
    if k == 3:  # counts add up over rows (the batch changes nothing per row)
        assert sum(one.stats.accepted for one in singles) == res.stats.accepted
        assert sum(one.stats.target_forwards for one in singles) == res.stats.target_forwards
    s = res.stats
    assert s.committed == 4 * N and 0 <= s.accepted <= s.drafted
    if kind == "self":  # every draft token accepted: tau == K+1 on full rounds
        assert s.accepted == s.drafted and s.acceptance_rate == 1.0
        full = (N - 1) // (k + 1)
        assert s.target_forwards == 4 * (full + (1 if (N - 1) % (k + 1) else 0))
        assert s.accept_per_position == [1.0] * k


def test_tensor_batch_input(target, greedy_ref):
    ids = torch.tensor([ROWS[0], ROWS[0]])
    res = generate(target, ids, drafter=NGramDrafter(), max_new_tokens=N, eos_token_id=[])
    assert res.sequences == [greedy_ref[0], greedy_ref[0]]


@pytest.mark.parametrize("k", [1, 4])
def test_scripted_proposer_and_cache_invariant(target, greedy_ref, k):
    prop = Scripted(ROWS, greedy_ref, k)
    seen = []

    def check(info):
        assert info.cache_length == info.mask_length
        for b, a in enumerate(info.active):
            if a:
                assert info.valid_columns[b] == info.n_real[b] == len(info.tokens[b]) - 1
        seen.append(info.round)

    with watch_rounds(check):
        res = generate(target, ROWS[:2], drafter=prop, max_new_tokens=N, num_draft_tokens=k, eos_token_id=[])
    assert res.sequences == greedy_ref[:2]
    assert seen == list(range(len(seen))) and len(seen) == res.stats.target_forwards // 2 + 1
    assert res.stats.accepted == 2 * sum(prop.right)  # both rows take the same path


def test_round_info_reports_each_rows_verified_chain(target, greedy_ref):
    """RoundInfo.drafts: the draft tokens each row had verified, cut to its remaining budget (K > left - 1)."""
    k, n = 4, 11
    drafter = DraftLM.from_model(tiny_llama(0))  # the target itself: every draft token is accepted
    rounds = []
    with watch_rounds(rounds.append):
        res = generate(target, ROWS[:1], drafter=drafter, max_new_tokens=n, num_draft_tokens=k, eos_token_id=[])
    out, pos = res.sequences[0], 1  # the first token comes from prefill
    assert rounds[0].drafts == [[]]
    for info in rounds[1:]:
        chain = info.drafts[0]
        assert chain == out[pos: pos + len(chain)] and len(chain) == min(k, n - pos - 1)
        pos += len(chain) + 1
    assert pos == n and out == greedy_ref[0][:n]


def _all_accept_stats(length, k):
    """Expected (accepted, target_forwards) for a B=1 row of ``length`` tokens when every draft is accepted."""
    full, rem = divmod(length - 1, k + 1)
    return full * k + rem, full + (1 if rem else 0)


def test_eos_at_every_position_of_an_accepted_block(target):
    """K=4, every draft accepted: EOS at the prefill token, at each draft position and on the bonus token."""
    k, prompt = 4, [50, 51]  # this prompt's greedy continuation has 14 distinct leading tokens
    ref = generate(target, [prompt], max_new_tokens=N, eos_token_id=[]).sequences[0]
    assert len(set(ref[:12])) == 12
    for pos in range(12):
        res = generate(target, [prompt], drafter=target, max_new_tokens=N, num_draft_tokens=k, eos_token_id=ref[pos])
        assert res.sequences[0] == ref[: pos + 1] and res.finish_reasons == ["stop"]
        acc, fwd = _all_accept_stats(pos + 1, k)
        s = res.stats
        assert (s.committed, s.accepted, s.target_forwards) == (pos + 1, acc, fwd)
        assert s.tau == ((pos + 1 - 1) / fwd if fwd else 1.0)


def test_eos_default_comes_from_generation_config(target, greedy_ref):
    ref = greedy_ref[1]
    target.generation_config.eos_token_id = ref[3]
    try:
        res = generate(target, [ROWS[1]], drafter=NGramDrafter(), max_new_tokens=N)
    finally:
        target.generation_config.eos_token_id = 2
    assert res.sequences[0] == ref[: ref.index(ref[3]) + 1] and res.finish_reasons == ["stop"]


@pytest.mark.parametrize("max_new", [1, 2, 5, 6, 7, 13])
def test_max_new_tokens_boundaries(target, greedy_ref, max_new):
    k = 5
    res = generate(target, [ROWS[0]], drafter=target, max_new_tokens=max_new, num_draft_tokens=k, eos_token_id=[])
    assert res.sequences[0] == greedy_ref[0][:max_new] and res.finish_reasons == ["length"]
    fwd = -(-(max_new - 1) // (k + 1))  # each round emits min(K+1, remaining) tokens
    acc = max_new - 1 - fwd
    assert (res.stats.accepted, res.stats.target_forwards, res.stats.committed) == (acc, fwd, max_new)
    assert res.stats.drafted == acc  # K clamped to the remaining budget: nothing drafted in vain


def test_stop_beats_length_in_the_same_block(target, greedy_ref):
    """EOS at the very token where max_new_tokens ends, inside the first verification block (tokens 1-6 with
    K=5): the row finishes "stop". The EOS is a token that first occurs there, so nothing stops earlier."""
    ref = greedy_ref[0]
    firsts = [i for i in range(6, 0, -1) if ref[i] not in ref[:i]]  # the last position of the block first
    assert firsts, f"greedy output {ref[:7]} repeats a token at every position 1-6: no EOS stops exactly there"
    last = firsts[0]
    res = generate(target, [ROWS[0]], drafter=target, max_new_tokens=last + 1, num_draft_tokens=5,
                   eos_token_id=ref[last])
    assert res.sequences[0] == ref[: last + 1] and res.finish_reasons == ["stop"]


def test_features_given_to_proposer_match_target_hidden_states(target):
    class FeatureProbe:
        feature_layers = (0, 2)

        def check_compatible(self, target, vocab_size):
            pass

        def reset(self, batch_size):
            self.checked = 0

        def propose(self, state, k, sampling, generator):
            for toks, feats in zip(state.tokens, state.features):
                full = target(torch.tensor([toks[:-1]]), output_hidden_states=True).hidden_states
                want = torch.cat([full[0][0], full[2][0]], -1)
                assert feats.shape == want.shape
                assert torch.allclose(feats, want, atol=1e-4)
                self.checked += 1
            return Proposal(torch.tensor([[t[-1]] * k for t in state.tokens]), None)

    probe = FeatureProbe()
    generate(target, ROWS[:2], drafter=probe, max_new_tokens=8, num_draft_tokens=2, eos_token_id=[])
    assert probe.checked >= 4


def test_tree_with_a_chain_only_drafter_or_a_bad_tree_is_refused(target):
    chain_only = _Fixed(lambda state, k: torch.zeros(len(state.tokens), k, dtype=torch.long))
    with pytest.raises(ValueError, match="proposes chains only"):
        generate(target, [[1, 2]], drafter=chain_only, max_new_tokens=3, tree=[[0]])
    with pytest.raises(ValueError, match="no parent"):
        generate(target, [[1, 2]], drafter=NGramDrafter(), max_new_tokens=3, tree=[[0, 0]])
    # plain decoding drafts nothing: the tree is unused
    assert generate(target, [[1, 2]], max_new_tokens=3, tree="2,2").sequences == \
        generate(target, [[1, 2]], max_new_tokens=3).sequences


@pytest.mark.parametrize("kwargs,match", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 3, "temperature": -1.0}, "temperature"),
    ({"max_new_tokens": 3, "top_p": 0.0}, "top_p"), ({"max_new_tokens": 3, "num_draft_tokens": 0}, "num_draft"),
])
def test_bad_arguments(target, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(target, [[1, 2]], **kwargs)


def test_bad_input_ids(target):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(target, [[1, 500]], max_new_tokens=2)
    with pytest.raises(ValueError, match="at least one token"):
        generate(target, [[1], []], max_new_tokens=2)


def test_draft_with_other_vocab_is_refused_before_generating(target):
    calls = []
    target.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="64.*128"):
            generate(target, [[1, 2]], drafter=tiny_llama(1, vocab_size=64), max_new_tokens=4)
        other = tiny_llama(1)
        other.config.eos_token_id = 7
        with pytest.raises(ValueError, match="eos_token_id"):
            generate(target, [[1, 2]], drafter=other, max_new_tokens=4)
        assert calls == []
    finally:
        target._forward_hooks.clear()


def test_padding_rows_are_tolerated_and_never_proposed(target, greedy_ref):
    padded = tiny_llama(1, vocab_size=136, layers=1)
    with torch.no_grad():
        padded.lm_head.weight[128:] = 1000.0  # padding rows would win every argmax
    res = generate(target, [ROWS[0]], drafter=padded, max_new_tokens=N, num_draft_tokens=3, eos_token_id=[])
    assert res.sequences[0] == greedy_ref[0]
    res = generate(target, [ROWS[0]], drafter=padded, max_new_tokens=N, temperature=1.0, seed=0, eos_token_id=[])
    assert max(res.sequences[0]) < 128


def test_nan_draft_probs_never_emit_impossible_tokens(target):
    class NaNDrafter:
        feature_layers = None

        def check_compatible(self, target, vocab_size):
            pass

        def reset(self, batch_size):
            pass

        def propose(self, state, k, sampling, generator):
            b = len(state.tokens)
            probs = torch.full((b, k, 128), float("nan"))
            probs[:, :, 0] = float("inf")
            return Proposal(torch.full((b, k), 127), probs)  # 127: outside the target's top-5

    res = generate(target, ROWS[:2], drafter=NaNDrafter(), max_new_tokens=12, temperature=1.0, top_k=5, seed=0,
                   eos_token_id=[])
    for row, out in zip(ROWS[:2], res.sequences):
        seq = torch.tensor([row + out])
        logits = target(seq).logits[0, len(row) - 1: -1]
        top5 = logits.topk(5, -1).indices
        assert all(t in top5[i].tolist() for i, t in enumerate(out))
    assert res.stats.accepted == 0


def test_sampling_is_reproducible_with_seed(target):
    a = generate(target, ROWS, drafter=tiny_llama(1, layers=1), max_new_tokens=10, temperature=0.8, seed=5)
    b = generate(target, ROWS, drafter=tiny_llama(1, layers=1), max_new_tokens=10, temperature=0.8, seed=5)
    assert a.sequences == b.sequences


@pytest.mark.parametrize("eos", [-1, 10**9, "2", True, [2, 128], [2.0], torch.tensor(7.5)])
def test_invalid_eos_token_id_is_refused_before_generating(target, eos):
    with pytest.raises(ValueError, match=r"eos_token_id must be an int or a list of ints in \[0, 128\)"):
        generate(target, [[1, 2]], max_new_tokens=3, eos_token_id=eos)


def test_valid_eos_forms_are_accepted(target, greedy_ref):
    stop = greedy_ref[0][2]
    for eos in (stop, [stop], (stop,), torch.tensor(stop), torch.tensor([stop])):
        res = generate(target, [ROWS[0]], max_new_tokens=N, eos_token_id=eos)
        assert res.sequences[0] == greedy_ref[0][:3] and res.finish_reasons == ["stop"]


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": True}, {"max_new_tokens": 3.0},
                                    {"max_new_tokens": 3, "num_draft_tokens": True}])
def test_bool_or_float_counts_are_refused(target, kwargs):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        generate(target, [[1, 2]], **kwargs)


def test_prompt_past_max_position_embeddings_warns(target):
    limit = target.config.max_position_embeddings
    with pytest.warns(UserWarning, match=f"max_position_embeddings \\({limit}\\)"):
        generate(target, [[3] * (limit - 2)], max_new_tokens=4, eos_token_id=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(target, [[3] * (limit - 4)], max_new_tokens=4, eos_token_id=[])


class _Fixed:
    """A proposer returning a fixed token block (to check the engine polices the protocol)."""

    feature_layers = None

    def __init__(self, make):
        self.make = make

    def check_compatible(self, target, vocab_size):
        pass

    def reset(self, batch_size):
        pass

    def propose(self, state, k, sampling, generator):
        return Proposal(self.make(len(state.tokens), k), None)


def test_proposer_shape_other_than_b_by_k_is_refused(target):
    for make, shape in ((lambda b, k: torch.zeros(b, k + 2, dtype=torch.long), "(1, 5)"),
                        (lambda b, k: torch.zeros(b, k - 1, dtype=torch.long), "(1, 2)"),
                        (lambda b, k: torch.zeros(b + 1, k, dtype=torch.long), "(2, 3)"),
                        (lambda b, k: torch.zeros(k, dtype=torch.long), "(3,)")):
        with pytest.raises(ValueError, match=rf"_Fixed.propose returned tokens of shape \{shape[:-1]}\).*\[1, 3\]"):
            generate(target, [[1, 2]], drafter=_Fixed(make), max_new_tokens=8, num_draft_tokens=3)


def test_out_of_vocab_proposals_are_cut_exactly_and_warned_once(target, greedy_ref):
    bad = _Fixed(lambda b, k: torch.full((b, k), 500, dtype=torch.long))
    with pytest.warns(UserWarning, match=r"_Fixed.propose returned token ids \[500\] outside \[0, 128\)") as rec:
        res = generate(target, [ROWS[0]], drafter=bad, max_new_tokens=N, num_draft_tokens=3, eos_token_id=[])
    assert len([w for w in rec if "outside [0, 128)" in str(w.message)]) == 1
    assert res.sequences[0] == greedy_ref[0]  # chains cut before the bad id: still exact
    assert res.stats.accepted == 0
