"""Medusa heads: the supervision offset, gradients, the decode-time offset, the zero-init identity."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import acceptance_before_after, greedy_continuation_batch, tiny_llama

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.train.recipe import recipe_from_dict
from drafterkit.train.strategies import get_strategy
from drafterkit.train.strategies.medusa import head_labels

K = 3


def _drafter(target, **kw):
    return MedusaDrafter(MedusaConfig.from_target(target, num_heads=K, **kw), target=target)


def _batch(length: int, prompt: int = 0):
    ids = torch.arange(length)[None]  # token at position t is t
    lm = torch.ones_like(ids)
    lm[:, :prompt] = 0
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": lm}


def test_head_k_is_supervised_with_token_t_plus_k_plus_2():
    length = 10
    starts, labels = head_labels(_batch(length), K)
    t = starts[1]
    assert t.tolist() == list(range(length - 2))  # head 0 needs token t+2 to exist
    for k in range(K):
        want = torch.where(t + k + 2 < length, t + k + 2, torch.full_like(t, -100))
        assert torch.equal(labels[k], want), k


def test_prompt_tokens_are_not_supervised():
    starts, labels = head_labels(_batch(10, prompt=5), K)
    # head 0 at t predicts t+2: the first supervised token is 5, so t starts at 3
    assert starts[1].min() == 3
    for k in range(K):
        sup = labels[k][labels[k] != -100]
        assert (sup >= 5).all()


def test_loss_matches_hand_computed_offsets_and_every_head_gets_gradient():
    target = tiny_llama(0)
    d = _drafter(target).train()
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "drafter": {"kind": "medusa", "options": {"num_heads": K}},
                               "loss": {"name": "ce", "ce_labels": "data"}})
    length = 12
    batch = _batch(length)
    loss, _metrics = get_strategy("medusa").loss(d, target, batch, recipe)
    loss.backward()
    for k in range(K):
        g = d.blocks[k][0].linear.weight.grad
        assert g is not None and g.abs().sum() > 0, f"head {k} got no gradient"
    with torch.no_grad():
        h = target(batch["input_ids"], output_hidden_states=True).hidden_states[-1][0]  # [T, H]
        want, starts = 0.0, length - 2  # chains start where token t+2 exists; each head's sum / starts
        for k in range(K):
            n = length - k - 2  # positions t with t+k+2 < length
            logits = d.head_logits(k, h[:n])
            want += 0.8 ** k * F.cross_entropy(logits, torch.arange(k + 2, k + 2 + n), reduction="sum") / starts
    assert torch.allclose(loss, torch.as_tensor(want), rtol=1e-5), (float(loss), float(want))


def test_fresh_heads_are_the_identity():
    target = tiny_llama(0)
    d = _drafter(target)
    h = torch.randn(4, target.config.hidden_size)
    for k in range(K):
        assert torch.equal(d.blocks[k](h), h)
        assert torch.allclose(d.head_logits(k, h), target.lm_head(h))


def test_propose_uses_the_state_that_predicted_the_last_token():
    target = tiny_llama(0)
    d = _drafter(target)
    with torch.no_grad():
        for k in range(K):
            d.blocks[k][0].linear.weight.normal_(0, 0.5)
    tokens = [4, 9, 17, 33, 2]
    with torch.no_grad():
        feats = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]  # [n-1, H]
    st = DecodeState(tokens=[tokens], num_stable=[0], features=[feats], active=[True], vocab_size=128)
    prop = d.propose(st, K, SamplingParams(), None)
    with torch.no_grad():
        want = [int(d.head_logits(k, feats[-1]).argmax()) for k in range(K)]  # features[n-2]
    assert prop.tokens[0].tolist() == want and prop.probs is None


def test_more_draft_tokens_than_heads_proposes_one_per_head():
    """K > num_heads: the drafter proposes num_heads tokens (Proposal.lengths) and decoding stays exact."""
    from drafterkit.decode import generate

    target = tiny_llama(0)
    d = _drafter(target)
    st = DecodeState(tokens=[[1, 2, 3]], num_stable=[0], features=[torch.zeros(2, 32)], active=[True],
                     vocab_size=128)
    for sampling in (SamplingParams(), SamplingParams(1.0)):
        prop = d.propose(st, K + 2, sampling, torch.Generator().manual_seed(0))
        assert prop.tokens.shape == (1, K + 2) and prop.lengths.tolist() == [K]
        assert torch.equal(prop.tokens[:, :K], d.propose(st, K, sampling, torch.Generator().manual_seed(0)).tokens)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    res = generate(target, prompts, drafter=d, max_new_tokens=12, num_draft_tokens=K + 2, eos_token_id=[])
    assert res.sequences == generate(target, prompts, max_new_tokens=12, eos_token_id=[]).sequences
    assert res.stats.drafted <= K * res.stats.target_forwards


def test_own_lm_heads_start_from_the_target_and_are_saved(tmp_path):
    from drafterkit.drafters import load_drafter

    target = tiny_llama(0)
    d = _drafter(target, share_lm_head=False)
    assert torch.equal(d.lm_heads[1].weight, target.lm_head.weight)
    assert "lm_heads.0.weight" in d.own_state_dict()
    back = load_drafter(d.save_pretrained(tmp_path / "m"), target=target)
    assert torch.equal(back.lm_heads[2].weight, d.lm_heads[2].weight)


def test_train_vocab_restricts_the_token_loss_and_is_not_saved(tmp_path):
    target = tiny_llama(0)
    d = _drafter(target).train()
    vocab = torch.arange(0, 128, 2)  # even ids only
    d.register_buffer("train_vocab", vocab, persistent=False)
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "drafter": {"kind": "medusa", "options": {"num_heads": K}},
                               "loss": {"name": "ce", "ce_labels": "data"}})
    length = 12
    loss, _ = get_strategy("medusa").loss(d, target, _batch(length), recipe)
    with torch.no_grad():
        h = target(torch.arange(length)[None], output_hidden_states=True).hidden_states[-1][0]
        want = 0.0
        for k in range(K):
            t = torch.arange(length - k - 2)
            keep = (t + k + 2) % 2 == 0  # data tokens outside the training vocabulary are skipped
            logits = d.blocks[k](h[t[keep]]) @ target.lm_head.weight[vocab].t()
            want += 0.8 ** k * F.cross_entropy(logits, (t[keep] + k + 2) // 2, reduction="sum") / (length - 2)
    assert torch.allclose(loss, torch.as_tensor(want), rtol=1e-5)
    assert "train_vocab" not in d.own_state_dict()


def test_training_raises_measured_acceptance():
    """40 optimizer steps on the tiny target's own greedy continuations: measured acceptance of the
    trained heads (decode.generate, same prompts) far above the fresh heads'. Own LM heads: a shared
    frozen 32-wide head leaves a tiny model too little capacity to learn."""
    target = tiny_llama(0)
    batch, _ = greedy_continuation_batch(target)
    prompts = [row[:4] for row in batch["input_ids"].tolist()]
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": "medusa", "options": {"num_heads": K}}})
    torch.manual_seed(0)
    d = _drafter(target, share_lm_head=False)
    before, after = acceptance_before_after("medusa", d, target, batch, recipe, prompts[:8], k=K, lr=1e-2)
    assert after > 0.25 and after > before + 0.2, (before, after)
