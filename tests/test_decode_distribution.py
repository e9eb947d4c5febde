"""Speculative sampling is exact: committed tokens follow the target's distribution (chi-square).

One generate call with a large batch (every row the same prompt, each row one sample) over a tiny
target with a 16-token vocabulary; the exact joint law of the first three tokens is enumerated with
full (cache-free) target forwards. max_new_tokens=3 with K=5 clamps the chain to one draft token, so
token 2 is an accepted draft or a correction and token 3 a bonus or the token after a correction.
"""

import pytest
import torch
from scipy import stats

from conftest import tiny_llama
from drafterkit.decode import generate
from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.sampling import logits_to_probs
from drafterkit.drafters.ngram import NGramDrafter

V, PROMPT, RUNS = 16, [1, 5, 9], 3000


def _exact_joint(target, params, prompt=PROMPT):
    """P(x1, x2, x3) as a [V, V, V] tensor (float64)."""
    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], params).double()
        two = torch.tensor([prompt + [a] for a in range(V)])
        p2 = logits_to_probs(target(two).logits[:, -1], params).double()  # [V, V]
        three = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = logits_to_probs(target(three).logits[:, -1], params).double().reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def _chi2(counts, probs):
    """Pearson chi-square over cells, cells with expected < 5 pooled into one."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    assert counts[probs == 0].sum() == 0, "a token of target probability 0 was emitted"
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@pytest.mark.parametrize("params,kind", [(SamplingParams(1.0), "draft_lm"), (SamplingParams(0.7, 5, 0.9), "draft_lm"),
                                         (SamplingParams(0.7, 5, 0.9), "ngram"), (SamplingParams(1.0), "hybrid"),
                                         (SamplingParams(1.0), "dflash"), (SamplingParams(0.7, 5, 0.9), "dflash"),
                                         (SamplingParams(1.0), "eagle3_2layers"), (SamplingParams(1.0), "dspark")],
                         ids=["t1", "t07_k5_p09", "ngram", "hybrid", "dflash_t1", "dflash_t07_k5_p09",
                              "eagle3_2layers_t1", "dspark_t1"])
def test_first_tokens_follow_target_distribution(params, kind):
    target = tiny_llama(0, vocab_size=V)
    drafter = tiny_llama(3, vocab_size=V, layers=1) if kind == "draft_lm" else NGramDrafter()
    # prompt lookup proposes only where the last token occurred before: put every id in the prompt
    prompt = PROMPT if kind in ("draft_lm", "dflash", "dspark", "eagle3_2layers") else list(range(V)) + PROMPT
    if kind in ("dflash", "dspark"):  # one block pass drafts from the target's features (a chain clamped to 1 here)
        from test_drafters_conformance import build

        drafter = build(kind, target)  # dspark: its q includes the Markov head's bias from the bonus token
    if kind == "eagle3_2layers":  # a stack of two decoder layers over a reduced draft vocabulary (q 0 off it)
        from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
        from test_drafters_conformance import _perturb

        drafter = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=12, num_layers=2), target=target)
        drafter.set_draft_vocab(torch.arange(12) + 2, target=target)
        _perturb(drafter)
        drafter.eval()
    if kind == "hybrid":  # the prompt's last 2-gram occurred before: the first round copies, later ones
        # depend on the sampled tokens (copy where the new 2-gram occurred, the draft LM's q elsewhere)
        from drafterkit.drafters.draft_lm import DraftLM
        from drafterkit.drafters.lookup.hybrid import LookupHybrid

        drafter = LookupHybrid(DraftLM.from_model(tiny_llama(3, vocab_size=V, layers=1)))
        prompt = PROMPT + list(range(V)) + PROMPT
    # EAGLE-3 drafts row by row (a per-row KV cache): 600 samples keep it to seconds
    runs = 600 if kind == "eagle3_2layers" else RUNS
    res = generate(target, [prompt] * runs, drafter=drafter, max_new_tokens=3, num_draft_tokens=5,
                   temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=1234,
                   eos_token_id=[])
    seqs = torch.tensor(res.sequences)  # [RUNS, 3]
    joint = _exact_joint(target, params, prompt)
    c12 = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    assert _chi2(c12, joint.sum(2).flatten()) > 1e-3
    for pos, marg in ((1, joint.sum((0, 2))), (2, joint.sum((0, 1)))):
        assert _chi2(torch.bincount(seqs[:, pos], minlength=V).double(), marg) > 1e-3
    s = res.stats
    # one round with one draft token per row; a rejected row needs one more round for its third token
    assert s.drafted == runs and 0 < s.accepted < runs and s.target_forwards == 2 * runs - s.accepted


@pytest.mark.parametrize("kind", ["medusa", "eagle+ngram", "ngram"])
def test_tree_first_tokens_follow_target_distribution(kind):
    """Tree drafts at temperature 1: three candidates at depth 1, two after each, verified by
    multi-candidate rejection sampling; the first three committed tokens keep the target's joint law."""
    from test_drafters_conformance import build

    target = tiny_llama(0, vocab_size=V)
    drafter = build(kind.split("+")[0], target)
    prompt = PROMPT
    if kind == "ngram":  # every id follows the prompt's last token somewhere: a wide lookup trie
        prompt = [t for a in range(V) for t in (PROMPT[-1], a)] + PROMPT
    if kind.endswith("+ngram"):  # a lookup match on the first round, drafter trees later
        from drafterkit.drafters.lookup.hybrid import LookupHybrid

        drafter = LookupHybrid(drafter)
        prompt = PROMPT + list(range(V)) + PROMPT
    params = SamplingParams(1.0)
    res = generate(target, [prompt] * RUNS, drafter=drafter, tree="3,2", max_new_tokens=3, temperature=1.0,
                   seed=99, eos_token_id=[])
    seqs = torch.tensor(res.sequences)
    joint = _exact_joint(target, params, prompt)
    c12 = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    assert _chi2(c12, joint.sum(2).flatten()) > 1e-3
    c23 = torch.bincount(seqs[:, 1] * V + seqs[:, 2], minlength=V * V).double()
    assert _chi2(c23, joint.sum(0).flatten()) > 1e-3
    assert 0 < res.stats.accepted
