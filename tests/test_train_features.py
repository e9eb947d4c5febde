"""Target features: alignment with a direct forward (across right padding), hooks == hidden_states,
the decoder's features == training features. The offline cache: tests/test_train_feature_cache.py."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode.protocol import Proposal
from drafterkit.train.features import target_features, target_hidden

ROWS = [[5, 9, 33, 2, 17, 80, 81], [40, 41, 42], [7, 7, 7, 7, 100]]


def _padded(rows, pad=0):
    t = max(map(len, rows))
    ids = torch.full((len(rows), t), pad)
    am = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)], am[b, : len(r)] = torch.tensor(r), 1
    return ids, am


@pytest.mark.parametrize("method", ["hooks", "hidden_states"])
def test_features_align_with_a_direct_forward_across_padding(method):
    target = tiny_llama(0, layers=3)
    layers = [0, 2, 3]
    ids, am = _padded(ROWS, pad=77)
    feats = target_features(target, ids, am, layers, method=method)  # [B, T, 3H]
    h = target.config.hidden_size
    assert feats.shape == (3, ids.shape[1], 3 * h)
    for b, r in enumerate(ROWS):
        with torch.no_grad():
            out = target(torch.tensor([r]), output_hidden_states=True)
        want = torch.cat([out.hidden_states[i][0] for i in layers], -1)  # [n, 3H]
        assert torch.allclose(feats[b, : len(r)], want, atol=1e-5), b
        # row t of the last layer is the state that predicts token t+1: the LM head gives the logits
        assert torch.allclose(target.lm_head(feats[b, : len(r), 2 * h:]), out.logits[0], atol=1e-4)


def test_hooks_keep_only_requested_layers_in_order():
    target = tiny_llama(0, layers=3)
    ids, am = _padded(ROWS)
    a = target_hidden(target, ids, am, [3, 1], method="hooks")
    b = target_hidden(target, ids, am, [3, 1], method="hidden_states")
    assert len(a) == 2 and all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="hidden_states indices"):
        target_hidden(target, ids, am, [4])


def test_decoder_features_equal_training_features():
    """What decode.generate shows a proposer is exactly what training computes."""
    from drafterkit.decode import engine

    target = tiny_llama(0, layers=3)
    seen = []

    class Recorder:
        feature_layers = (1, 3)

        def check_compatible(self, target, vocab_size):
            pass

        def reset(self, batch_size):
            pass

        def propose(self, state, k, sampling, generator):
            seen.append(([list(t) for t in state.tokens], [f.clone() for f in state.features]))
            return Proposal(tokens=torch.tensor([[t[-1]] * k for t in state.tokens]))

    engine.generate(target, [ROWS[0], ROWS[1]], drafter=Recorder(), max_new_tokens=8, num_draft_tokens=2)
    assert seen
    for tokens, feats in seen:
        for b, toks in enumerate(tokens):
            want = target_features(target, torch.tensor([toks[:-1]]), None, [1, 3])[0]
            assert feats[b].shape == want.shape
            assert torch.allclose(feats[b], want, atol=1e-4)


@pytest.mark.slow
def test_real_target_eagle3_layers_align_and_hooks_match(real_target):
    target, tok = real_target
    ids = tok.apply_chat_template([{"role": "user", "content": "Name three prime numbers."}],
                                  add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    layers = [2, 15, 27, 30]
    a = target_features(target, ids, None, layers, method="hooks")
    b = target_features(target, ids, None, layers, method="hidden_states")
    assert a.shape == (1, ids.shape[1], 4 * 576) and torch.allclose(a, b, atol=1e-4)
    with torch.no_grad():
        logits = target(ids).logits
    assert torch.allclose(target.lm_head(a[..., 3 * 576:]), logits, atol=1e-3)


@pytest.mark.parametrize("family", ["granite", "gemma2", "llama3"])
def test_the_targets_logits_from_its_last_feature_include_its_logit_transform(family):
    # Training compares the drafter with the target's distribution: Granite's logits_scaling and Gemma-2's
    # final soft-capping are part of it.
    from drafterkit.train.features import target_logits

    from families import build_family

    target, _ = build_family(family)
    ids = torch.tensor([[5, 9, 33, 70]])
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    assert torch.allclose(target_logits(target, out.hidden_states[-1]), out.logits, atol=1e-5)
