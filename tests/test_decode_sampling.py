"""decode.sampling: temperature / top-k / top-p shaping, identical to transformers' warpers; NaN-safe."""

import math

import pytest
import torch

from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.sampling import greedy_argmax, logits_to_probs, sample, sanitize_logits, select_tokens


def _hf_probs(logits, t, k, p):
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    x = TemperatureLogitsWarper(t)(None, logits.clone())
    if k:
        x = TopKLogitsWarper(k)(None, x)
    if p < 1:
        x = TopPLogitsWarper(p)(None, x)
    return torch.softmax(x, -1)


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.7, 8, 0.9)])
def test_matches_transformers_warpers(t, k, p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=g) * 3
    ours = logits_to_probs(logits, SamplingParams(t, k, p))
    assert torch.allclose(ours, _hf_probs(logits, t, k, p), atol=1e-6)
    assert torch.allclose(ours.sum(-1), torch.ones(6))


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 5.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams(0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    tok, q = select_tokens(logits, SamplingParams(0.0))
    assert tok.tolist() == [1, 0] and q is None


def test_vocab_size_masks_padding_rows():
    logits = torch.tensor([[0.0, 0.0, 9.0, 9.0]])
    probs = logits_to_probs(logits, SamplingParams(1.0), vocab_size=2)
    assert probs[0, 2:].sum() == 0 and math.isclose(probs.sum().item(), 1.0, rel_tol=1e-6)
    assert select_tokens(logits, SamplingParams(0.0), vocab_size=3)[0].item() == 2


def test_nan_and_inf_are_safe():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[nan, 1.0, 2.0, nan], [nan] * 4, [0.0, inf, inf, 1.0], [-inf] * 4])
    for params in (SamplingParams(1.0), SamplingParams(0.5, 2, 0.7), SamplingParams(0.0)):
        probs = logits_to_probs(logits, params)
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(4))
    probs = logits_to_probs(logits, SamplingParams(1.0))
    assert probs[0, 0] == 0 and probs[0, 3] == 0  # NaN never sampled when finite logits exist
    assert probs[2].tolist() == [0.0, 0.5, 0.5, 0.0]  # +inf entries share the mass
    assert torch.allclose(probs[1], torch.full((4,), 0.25))  # nothing usable -> uniform
    assert torch.isfinite(sanitize_logits(logits, vocab_size=3)[..., :3]).any(-1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_size", [None, 3, 5])
def test_greedy_argmax_is_the_repaired_argmax(dtype, vocab_size):
    nan, inf = float("nan"), float("inf")
    rows = [[nan, 1.0, 2.0, nan, 0.0], [nan] * 5, [0.0, inf, inf, 1.0, 0.0], [-inf] * 5, [-inf, 3.0, 3.0, -inf, 9.0],
            [1.0, -inf, 2.0, 2.0, 7.0], [0.0, 1.0, 0.5, inf, nan], [-inf, -inf, -inf, 4.0, 5.0]]
    logits = torch.tensor(rows, dtype=dtype)
    want = sanitize_logits(logits, vocab_size).argmax(-1)
    assert greedy_argmax(logits, vocab_size).tolist() == want.tolist()
    assert greedy_argmax(logits.view(2, 4, 5), vocab_size).tolist() == want.view(2, 4).tolist()  # any leading shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_argmax_breaks_ties_as_argmax(dtype):
    """Rows of few distinct values (many tied maxima, at any index): the first maximal id, as ``argmax``."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 3000), generator=g).to(dtype)
    assert greedy_argmax(logits).tolist() == logits.float().argmax(-1).tolist()
    assert greedy_argmax(logits, 1000).tolist() == logits[:, :1000].float().argmax(-1).tolist()


def test_sample_uses_generator():
    probs = torch.softmax(torch.randn(3, 50), -1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert a.tolist() == b.tolist() and a.shape == (3,)


@pytest.mark.parametrize("bad", [SamplingParams(-1.0), SamplingParams(1.0, -2), SamplingParams(1.0, 0, 0.0),
                                 SamplingParams(1.0, 0, 1.5)])
def test_bad_params_raise(bad):
    with pytest.raises(ValueError):
        logits_to_probs(torch.zeros(1, 4), bad)
