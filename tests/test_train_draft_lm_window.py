"""The draft LM's ``accept_len`` unroll (``train.strategies.draft_lm.unroll_alphas``) on a sliding-window draft LM
(Mistral, Gemma-2, Gemma-3, gpt-oss families with a window of 4) over sequences longer than the window: each
chain's acceptance probabilities equal those of the draft LM run on that chain's own tokens (the real prefix,
then its earlier draft tokens) by transformers' forward, which applies the window itself."""

from __future__ import annotations

import pytest
import torch
from families import SLIDING, build_family

from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.train.losses import acceptance_probability
from drafterkit.train.strategies.draft_lm import unroll_alphas

WINDOW, T, K = 4, 11, 3


@pytest.mark.parametrize("family", SLIDING)
def test_unroll_alphas_of_a_sliding_window_draft_lm_past_its_window(family):
    target, _ = build_family(family, sliding_window=WINDOW)
    lm = DraftLM.from_target(target, 2).lm.float().eval()
    assert lm.config.sliding_window == WINDOW
    ids = torch.randint(4, 320, (2, T), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, T - 2:] = 0  # right padding on the second row
    sup = torch.zeros_like(ids, dtype=torch.bool)
    sup[0, 1:T - 1], sup[1, 3:T - 3] = True, True  # chains starting past the window
    with torch.no_grad():
        t_logits = target(input_ids=ids, attention_mask=am).logits
        alphas, step_mask, first = unroll_alphas(lm, ids, am, t_logits, sup, K, temperature=1.0)
        plain = lm(input_ids=ids, attention_mask=am).logits
    assert torch.allclose(first[am.bool()], plain[am.bool()], atol=1e-5)
    n = 0
    for b in range(2):
        for t in range(T):
            if not sup[b, t]:
                continue
            seq = ids[b, : t + 1].tolist()
            for j in range(K):
                with torch.no_grad():
                    logits = lm(input_ids=torch.tensor([seq])).logits[0, -1]
                if step_mask[n, j]:
                    ref = acceptance_probability(logits[None], t_logits[b, t + j][None])[0]
                    assert torch.allclose(alphas[n, j], ref, atol=1e-5), (family, b, t, j, float(alphas[n, j]),
                                                                          float(ref))
                seq.append(int(logits.argmax()))
            n += 1
    assert n == alphas.shape[0]
