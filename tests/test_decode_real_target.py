"""decode.generate on the real default target (slow): greedy equivalence with transformers."""

import pytest
import torch

from decode import generate
from drafters.draft_lm import DraftLM
from drafters.ngram import NGramDrafter

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
