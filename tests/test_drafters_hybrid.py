"""drafters.lookup.hybrid: prompt lookup first, the trained drafter otherwise; exact under greedy and sampling."""

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import generate
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.lookup.hybrid import LookupHybrid
from drafterkit.speceval.methods import build_drafter


def _state(rows, vocab=128):
    return DecodeState(tokens=[list(r) for r in rows], num_stable=[0] * len(rows), features=None,
                       active=[True] * len(rows), vocab_size=vocab)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(1.0)], ids=["greedy", "t1"])
def test_matched_rows_copy_and_the_rest_keep_the_drafters_chain(sampling):
    target = tiny_llama(0)
    hybrid = LookupHybrid(DraftLM.from_target(target, 1), min_match=2)
    hybrid.reset(3)
    rows = [[7, 8, 9, 30, 7, 8],  # "7 8" occurred: copy 9 30 7 8
            [7, 8, 9, 30, 40, 8],  # only "8" repeats: a 1-token match is below min_match
            [3, 4, 5, 6]]  # no match
    g = torch.Generator().manual_seed(0)
    prop = hybrid.propose(_state(rows), 3, sampling, g)
    assert prop.tokens.shape == (3, 3)
    assert prop.tokens[0].tolist() == [9, 30, 7] and int(prop.lengths[0]) == 3
    assert prop.lengths[1:].tolist() == [3, 3]  # the draft LM's full chains
    assert (hybrid.lookup_rows, hybrid.drafter_rows) == (1, 2)
    if sampling.greedy:
        return
    assert prop.probs is not None
    assert torch.equal(prop.probs[0].argmax(-1), prop.tokens[0]) and torch.allclose(prop.probs[0].sum(-1),
                                                                                    torch.ones(3))
    assert prop.probs[0].max(-1).values.eq(1).all()  # one-hot q: the copy is deterministic
    assert prop.probs[1].max() < 1  # the draft LM's sampled rows keep their q


def test_greedy_output_equals_plain_decoding_and_threshold_passes_through():
    target = tiny_llama(0)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(3, 128, (6,), generator=g).tolist()
    prompts = [base + base + base[:2], torch.randint(3, 128, (9,), generator=g).tolist()]
    plain = generate(target, prompts, max_new_tokens=24, eos_token_id=[])
    hybrid = LookupHybrid(DraftLM.from_target(target, 1))
    hybrid.draft_threshold = 0.3
    assert hybrid.drafter.draft_threshold == 0.3 and hybrid.supports_draft_threshold
    res = generate(target, prompts, drafter=hybrid, max_new_tokens=24, num_draft_tokens=4, eos_token_id=[])
    assert res.sequences == plain.sequences
    assert hybrid.lookup_rows > 0 and hybrid.drafter_rows > 0


def test_eval_spec_and_errors():
    target = tiny_llama(0)
    spec = build_drafter("draft:1+ngram", target)
    assert spec.label == "draft:1+ngram" and isinstance(spec.drafter, LookupHybrid) and spec.hf_kwargs is None
    for bad in ("ngram+ngram", "none+ngram", "+ngram"):
        with pytest.raises(ValueError, match=r"--drafter ngram"):
            build_drafter(bad, target)
    with pytest.raises(ValueError, match=r"give one of \+ngram, \+rest or \+suffix"):
        build_drafter("draft:1+ngram+ngram", target)
    with pytest.raises(ValueError, match=r"draft:1\+ngram"):
        build_drafter("ngram+draft:1", target)
    with pytest.raises(ValueError, match="min_match"):
        LookupHybrid(spec.drafter.drafter, max_ngram=2, min_match=3)


class _Recorder:
    """A proposer wrapper that records every call's tokens and proposal (to replay on a fresh copy)."""

    def __init__(self, drafter):
        self.d, self.calls = drafter, []
        self.feature_layers = drafter.feature_layers
        self.kind = drafter.kind

    def check_compatible(self, target, vocab_size):
        self.d.check_compatible(target, vocab_size)

    def reset(self, batch_size):
        self.d.reset(batch_size)

    def propose(self, state, k, sampling, generator):
        snap = DecodeState(tokens=[list(r) for r in state.tokens], num_stable=list(state.num_stable),
                           features=None if state.features is None else [f.clone() for f in state.features],
                           active=list(state.active), vocab_size=state.vocab_size)  # the engine's lists grow
        prop = self.d.propose(state, k, sampling, generator)
        self.calls.append((snap, k, prop))
        return prop


@pytest.mark.parametrize("kind", ["draft_lm", "eagle3"])
def test_skipped_rounds_resynchronise_the_drafters_caches(kind):
    """Rounds where every row copies skip the drafter; its next proposal must equal a fresh drafter's
    (no cache) on the same state, and the output must equal plain greedy decoding."""
    from test_drafters_conformance import build

    target = tiny_llama(0)
    g = torch.Generator().manual_seed(2)
    base = torch.randint(3, 128, (5,), generator=g).tolist()
    prompts = [base * 3 + base[:2], base * 2 + torch.randint(3, 128, (4,), generator=g).tolist()]
    import copy

    drafter = build(kind, target)
    fresh = copy.deepcopy(drafter)  # same weights, its own (empty) caches
    rec = _Recorder(drafter)
    hybrid = LookupHybrid(rec)
    res = generate(target, prompts, drafter=hybrid, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    assert res.sequences == generate(target, prompts, max_new_tokens=30, eos_token_id=[]).sequences
    assert 0 < len(rec.calls) < res.stats.target_forwards and hybrid.lookup_rows > 0  # some rounds skipped it
    for state, k, prop in rec.calls:
        fresh.reset(len(state.tokens))
        again = fresh.propose(DecodeState(tokens=state.tokens, num_stable=[0] * len(state.tokens),
                                          features=state.features, active=state.active,
                                          vocab_size=state.vocab_size), k, SamplingParams(), None)
        for b, active in enumerate(state.active):
            if active:
                assert prop.tokens[b].tolist() == again.tokens[b].tolist()
