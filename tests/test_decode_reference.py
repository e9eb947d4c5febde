"""decode/reference.py, the short batch-1 greedy round, against ``decode.generate`` and plain greedy decoding:
the same tokens and the same draft / acceptance counts, on tiny seeded targets of two families with a
model-free drafter (prompt lookup), a feature-reading head (a random EAGLE-3) and a draft LM copied from the
target (every draft token accepted: the bonus token and the cache crop at full length)."""

from __future__ import annotations

import pytest
import torch
from families import build_family, family_prompts

from drafterkit.decode import generate
from drafterkit.decode.reference import reference_generate
from drafterkit.drafters import get_kind

NEW, K = 24, 4


def _drafter(kind: str, target):
    if kind == "ngram":
        return get_kind("ngram")()
    if kind == "draft_lm":  # every layer of the target: drafts what the target would emit
        from drafterkit.drafters.draft_lm import DraftLM
        return DraftLM.from_target(target, target.config.num_hidden_layers).eval()
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    torch.manual_seed(0)
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64), target=target)
    d.set_draft_vocab(torch.arange(64) * 5, target=target)
    return d.eval()


def _plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with no cache: one full forward per new token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def target(request):
    model, _ = build_family(request.param)
    return model


@pytest.mark.parametrize("kind", ["ngram", "eagle3", "draft_lm"])
def test_reference_round_equals_generate_and_plain_greedy(target, kind):
    drafter = _drafter(kind, target)
    for prompt in family_prompts(2, length=6):
        ref = reference_generate(target, drafter, prompt, NEW, K)
        res = generate(target, [prompt], drafter=drafter, max_new_tokens=NEW, num_draft_tokens=K, eos_token_id=[])
        assert ref.tokens == res.sequences[0] == _plain_greedy(target, prompt, NEW)
        assert (sum(ref.drafted), sum(ref.accepted), len(ref.accepted)) == \
            (res.stats.drafted, res.stats.accepted, res.stats.target_forwards)
        if kind == "draft_lm":  # a copy of the target: every draft token accepted, K + 1 tokens a round
            assert ref.accepted == ref.drafted and ref.accepted[0] == K
        if kind == "ngram":
            assert sum(ref.drafted) > 0  # the lookup found matches, and some rounds verified them


def test_reference_stops_after_eos_as_generate_does(target):
    prompt = family_prompts(1, length=6)[0]
    plain = _plain_greedy(target, prompt, NEW)
    eos = plain[NEW // 2]  # a token the target emits halfway
    ref = reference_generate(target, get_kind("ngram")(), prompt, NEW, K, eos_token_id=eos)
    res = generate(target, [prompt], drafter=get_kind("ngram")(), max_new_tokens=NEW, num_draft_tokens=K,
                   eos_token_id=eos)
    assert ref.tokens == res.sequences[0] == plain[: plain.index(eos) + 1]
    assert (sum(ref.drafted), sum(ref.accepted)) == (res.stats.drafted, res.stats.accepted)
