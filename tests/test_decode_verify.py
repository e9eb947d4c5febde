"""decode.verify: greedy verification and exact rejection sampling (Leviathan et al. 2023)."""

import pytest
import torch
from scipy import stats

from drafterkit.decode.verify import verify_greedy, verify_sampling


def _logits_with_argmax(argmax_rows, vocab=10):
    logits = torch.zeros(len(argmax_rows), len(argmax_rows[0]), vocab)
    for b, row in enumerate(argmax_rows):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    return logits


def test_verify_greedy_prefix_and_correction():
    logits = _logits_with_argmax([[3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6]])
    drafts = torch.tensor([[3, 4, 5], [3, 9, 5], [7, 4, 5]])
    n, nxt = verify_greedy(logits, drafts)
    assert n.tolist() == [3, 1, 0]
    assert nxt.tolist() == [6, 4, 3]  # bonus from position K, else the correction


def test_verify_greedy_limit_takes_bonus_from_limit():
    logits = _logits_with_argmax([[3, 4, 5, 6], [3, 4, 5, 6]])
    n, nxt = verify_greedy(logits, torch.tensor([[3, 4, 5], [3, 4, 0]]), limit=torch.tensor([1, 2]))
    assert n.tolist() == [1, 2] and nxt.tolist() == [4, 5]


def test_verify_greedy_zero_drafts():
    n, nxt = verify_greedy(_logits_with_argmax([[7]]), torch.zeros(1, 0, dtype=torch.long))
    assert n.tolist() == [0] and nxt.tolist() == [7]


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="K\\+1"):
        verify_greedy(torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long))


def test_verify_sampling_p_equals_q_accepts_all():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 4, 12, generator=g), -1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 12), 1, generator=g).reshape(64, 3)
    n, _ = verify_sampling(p, p[:, :3], drafts, g)
    assert n.tolist() == [3] * 64


def test_zero_probability_draft_never_accepted_even_with_bad_q():
    p = torch.zeros(200, 2, 6)
    p[..., :3] = 1 / 3
    drafts = torch.full((200, 1), 5)
    for q in (None, torch.full((200, 1, 6), float("nan")), torch.zeros(200, 1, 6)):
        n, nxt = verify_sampling(p, q, drafts, torch.Generator().manual_seed(1))
        assert n.sum() == 0 and (nxt < 3).all()


def _chi2_ok(samples, probs):
    counts = torch.bincount(samples, minlength=len(probs)).double()
    keep = probs > 0
    assert counts[~keep].sum() == 0
    expected = probs[keep].double() * len(samples)
    return stats.chisquare(counts[keep], expected / expected.sum() * counts[keep].sum()).pvalue


@pytest.mark.parametrize("one_hot", [False, True])
def test_first_committed_token_distributed_as_p(one_hot):
    """Token committed at position 0 (accepted d_1 or the correction) ~ p_0 exactly."""
    g = torch.Generator().manual_seed(123)
    n_runs, vocab = 20000, 8
    p0 = torch.softmax(torch.randn(vocab, generator=g) * 1.5, -1)
    q0 = torch.softmax(torch.randn(vocab, generator=g) * 1.5, -1)
    p = p0.expand(n_runs, 2, vocab).clone()
    q = q0.expand(n_runs, 1, vocab).clone()
    drafts = torch.multinomial(q0, n_runs, replacement=True, generator=g)[:, None]
    n, nxt = verify_sampling(p, None if one_hot else q, drafts, g)
    committed = torch.where(n > 0, drafts[:, 0], nxt)
    assert _chi2_ok(committed, p0) > 0.001
    if not one_hot:  # acceptance rate = sum min(p, q)
        assert abs(n.float().mean().item() - torch.minimum(p0, q0).sum().item()) < 0.02
