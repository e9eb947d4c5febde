"""EAGLE-1 head: KV-cached decoding equals recomputation, re-sync after rejections, training step."""

from __future__ import annotations

import torch
from conftest import acceptance_before_after, greedy_continuation_batch, tiny_llama

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
from drafterkit.train.recipe import recipe_from_dict
from drafterkit.train.strategies import get_strategy


def _drafter(target, seed=0):
    torch.manual_seed(seed)
    d = EagleDrafter(EagleConfig.from_target(target), target=target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith(d.borrowed_prefixes):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return d.eval()


def _state(target, tokens, stable):
    with torch.no_grad():
        f = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    return DecodeState(tokens=[list(tokens)], num_stable=[stable], features=[f], active=[True],
                       vocab_size=target.config.vocab_size)


def _reference_chain(d, state, k):
    """Greedy chain recomputed from scratch at every step (no KV cache)."""
    tokens, feats = state.tokens[0], state.features[0]
    ids, hid, out = list(tokens[1:]), feats.clone(), []
    with torch.no_grad():
        for _ in range(k):
            pred, _, _ = d._step(torch.tensor([ids]), hid[None], 0, None)  # [1, m, H]
            f_new = pred[0, -1]
            tok = int(d.lm_head(f_new).argmax())
            out.append(tok)
            ids.append(tok)
            hid = torch.cat([hid, f_new[None]])
    return out


def test_cached_chain_equals_recomputation():
    target = tiny_llama(0)
    d = _drafter(target)
    tokens = [7, 3, 99, 42, 42, 5, 18]
    d.reset(1)
    st = _state(target, tokens, 0)
    got = d.propose(st, 4, SamplingParams(), None).tokens[0].tolist()
    assert got == _reference_chain(d, st, 4)


def test_training_unroll_drafts_the_decoder_chain():
    """Step j of the training forward (unrolled on the head's own features and greedy drafts) at the last
    real position proposes draft token j + 1 of decoding."""
    target = tiny_llama(0)
    d = _drafter(target)
    tokens, k = [7, 3, 99, 42, 42, 5, 18], 4
    st = _state(target, tokens, 0)
    d.reset(1)
    drafts = d.propose(st, k, SamplingParams(), None).tokens[0].tolist()
    assert drafts == _reference_chain(d, st, k)
    with torch.no_grad():
        f = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1]
        outs = d(torch.tensor([tokens]), f, steps=k)  # k x [1, T, H]; outs[j][:, t] estimates f[:, t+1+j]
    assert [int(d.lm_head(outs[j][0, len(tokens) - 2]).argmax()) for j in range(k)] == drafts


def test_resync_after_accepts_and_rejections_equals_a_fresh_drafter():
    target = tiny_llama(0)
    seq = [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13]
    rounds = [(seq[:5], 0), (seq[:8], 5), (seq[:6] + [77, 78, 79], 6), (seq[:6] + [77, 78, 79, 80], 9)]
    live = _drafter(target)
    live.reset(1)
    for tokens, stable in rounds:
        a = live.propose(_state(target, tokens, stable), 3, SamplingParams(), None).tokens
        fresh = _drafter(target)
        fresh.reset(1)
        b = fresh.propose(_state(target, tokens, 0), 3, SamplingParams(), None).tokens
        assert torch.equal(a, b), (tokens, stable)


def test_sampled_proposal_q_is_over_the_target_vocabulary():
    target = tiny_llama(0)
    d = _drafter(target)
    d.reset(1)
    gen = torch.Generator().manual_seed(0)
    prop = d.propose(_state(target, [4, 5, 6, 7], 0), 3, SamplingParams(temperature=0.8, top_k=20), gen)
    assert prop.probs.shape == (1, 3, 128)
    assert torch.allclose(prop.probs.sum(-1), torch.ones(1, 3), atol=1e-5)
    assert ((prop.probs > 0).sum(-1) <= 20).all()


def test_training_step_moves_the_head_not_the_target():
    target = tiny_llama(0)
    torch.manual_seed(0)
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": "eagle", "options": {"input_noise": 0.1}}})
    d = EagleDrafter(EagleConfig.from_target(target), target=target, init_from_target=True).train()
    ids = torch.randint(3, 128, (2, 12))
    am = torch.ones_like(ids)
    am[1, 9:] = 0
    batch = {"input_ids": ids, "attention_mask": am, "loss_mask": am.clone()}
    before_t = {k: v.clone() for k, v in target.state_dict().items()}
    before_d = {k: v.clone() for k, v in d.own_state_dict().items()}
    params = [p for p in d.parameters() if p.requires_grad]
    assert params and all(not p.requires_grad for p in target.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    loss, metrics = get_strategy("eagle").loss(d, target, batch, recipe)
    assert torch.isfinite(loss) and metrics["feature_smooth_l1"] > 0
    loss.backward()
    opt.step()
    after_d = d.own_state_dict()
    assert any(not torch.equal(before_d[k], after_d[k]) for k in before_d)
    assert all(torch.equal(before_t[k], v) for k, v in target.state_dict().items())
    assert not any(k.startswith(("embed.", "lm_head.")) for k in after_d)


def test_training_raises_measured_acceptance():
    """40 optimizer steps on the tiny target's greedy continuations raise the acceptance measured by
    decode.generate on unseen prompts well above the untrained head's."""
    target = tiny_llama(0)
    batch, g = greedy_continuation_batch(target)
    held = [torch.randint(3, 128, (4,), generator=g).tolist() for _ in range(8)]
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": "eagle", "options": {}}})
    torch.manual_seed(0)
    d = EagleDrafter(EagleConfig.from_target(target), target=target)
    before, after = acceptance_before_after("eagle", d, target, batch, recipe, held, k=3, lr=3e-3)
    assert after > 0.1 and after > before + 0.1, (before, after)


def _reference_attention(attn, x, positions, mask):
    """Llama attention spelled out: float64 RoPE angles, every query head over its key/value head."""
    b, t, _ = x.shape
    d, rep = attn.head_dim, attn.heads // attn.kv_heads
    inv = 1.0 / (attn.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions.double()[..., None] * inv
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]

    def rot(u):
        u = u.double()
        a, c = u.chunk(2, -1)
        return u * cos + torch.cat((-c, a), -1) * sin

    q = rot(attn.q_proj(x).view(b, t, attn.heads, d).transpose(1, 2))
    k = rot(attn.k_proj(x).view(b, t, attn.kv_heads, d).transpose(1, 2))
    v = attn.v_proj(x).view(b, t, attn.kv_heads, d).transpose(1, 2).double()
    scores = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / d ** 0.5
    w = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    out = (w @ v.repeat_interleave(rep, 1)).transpose(1, 2).reshape(b, t, -1)
    return attn.o_proj(out.to(x.dtype))


def test_head_attention_matches_llama_attention_with_grouped_heads_at_far_positions():
    """Grouped-query attention without copying key/value heads, and RoPE angles computed in float32 even
    after the module is cast to bf16: a query 1,000 positions past its cached keys (a bf16 frequency table
    would turn their relative angle by radians)."""
    from drafterkit.drafters.heads.layers import DraftAttention, causal_mask

    torch.manual_seed(0)
    attn = DraftAttention(64, 64, heads=4, kv_heads=2, head_dim=16, rope_theta=10000.0).eval()
    x = torch.randn(1, 6, 64) * 3
    positions = torch.tensor([[0, 1, 2, 3, 4, 1000]])
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):  # a bf16 table: off by 0.24
        attn.to(dtype)
        with torch.no_grad():
            _, past = attn(x[:, :5].to(dtype), positions[:, :5], causal_mask(5, 0))
            assert past[0].shape == past[1].shape == (1, 2, 5, 16)  # the cache keeps the key/value heads only
            got, _ = attn(x[:, 5:].to(dtype), positions[:, 5:], causal_mask(1, 5), past)
            ref = _reference_attention(attn, x.to(dtype), positions, causal_mask(6, 0))[:, 5:]
        torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=0)
