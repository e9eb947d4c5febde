"""decode.generate on the real default target (slow): greedy equivalence with transformers."""

import pytest
import torch

from drafterkit.decode import generate
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.ngram import NGramDrafter

pytestmark = pytest.mark.slow
N = 16


@pytest.fixture(scope="module")
def chat(real_target):
    model, tok = real_target
    ids = tok.apply_chat_template([{"role": "user", "content": "List three uses of a paperclip, briefly."}],
                                  add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    ref = model.generate(ids, max_new_tokens=N, do_sample=False)[0, ids.shape[1]:].tolist()
    return model, ids, ref


@pytest.mark.parametrize("kind", ["plain", "ngram", "truncated"])
def test_real_target_greedy_equivalence(chat, kind):
    model, ids, ref = chat
    drafter = {"plain": None, "ngram": NGramDrafter(), "truncated": DraftLM.from_target(model, 2)}[kind]
    res = generate(model, ids, drafter=drafter, max_new_tokens=N, num_draft_tokens=3)
    assert res.sequences[0] == ref
    assert res.stats.committed == len(ref)
    if kind == "plain":
        assert res.stats.tau == 1.0
    else:
        assert res.stats.tau >= 1.0 and res.stats.drafted > 0


@pytest.mark.parametrize("kind", ["eagle3+ngram", "scripted"])
def test_real_target_tree_drafts_are_exact(chat, kind):
    """Tree attention through the real 30-layer target: a random EAGLE-3 head behind prompt lookup, and
    a scripted proposer that puts the true continuation on a cycling path (deep acceptances, so the
    accepted path's cache columns are moved and reused)."""
    from test_decode_tree import ScriptedTree

    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    from drafterkit.drafters.lookup.hybrid import LookupHybrid

    model, ids, ref = chat
    if kind == "scripted":
        drafter = ScriptedTree([ids[0].tolist()], [ref])
    else:
        head = Eagle3Drafter(Eagle3Config.from_target(model, draft_vocab_size=512), target=model)
        head.set_draft_vocab(torch.arange(512), target=model)
        drafter = LookupHybrid(head.eval())
    res = generate(model, ids, drafter=drafter, tree="3,2,1", max_new_tokens=N)
    assert res.sequences[0] == ref and res.stats.committed == len(ref)
    if kind == "scripted":
        assert res.stats.tau > 2.0
