"""decode.compact: the target's forward as one function computes what transformers' forward computes.

On tiny seeded random targets of each covered family (Llama-3 with its RoPE scaling, Qwen2 with q/k/v biases, Qwen3
with q/k norms, Mistral without a window, the tests' GQA Llama): the same passes through two
``decode.cache.RaggedCache`` s, one with the compact forward and one without, give the same logits and hidden
states (a ragged prefill, chain passes with rejections, a tree pass); and whole greedy decodes (plain, prompt
lookup, a tree) give the same tokens as with transformers' forward.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from families import build_family
from drafterkit import decode
from drafterkit.decode import compact
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.fused import fused_projections
from drafterkit.drafters.ngram import NGramDrafter

COVERED = ["llama3", "qwen2", "qwen3"]


def covered_models():
    models = {f: build_family(f)[0] for f in COVERED}
    models["mistral-no-window"] = build_family("mistral", sliding_window=None)[0]
    models["gqa-llama"] = tiny_llama(3, hidden_size=64, heads=4, kv_heads=2, layers=3)
    return models


MODELS = covered_models()


def passes(model, use_compact: bool, dtype: torch.dtype):
    """A ragged prefill, a chain pass with rejections and a tree pass; every output's logits and hidden states."""
    cache = RaggedCache(model, 2, torch.device("cpu"), capacity=8)
    assert cache.compact  # the model is covered
    cache.compact = use_compact
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    outs = [cache.prefill([[5, 9, 11, 4, 7], [3, 8]], logits_to_keep=1, output_hidden_states=True)]
    outs.append(cache.run(torch.randint(4, vocab, (2, 4), generator=gen), logits_to_keep=4,
                          output_hidden_states=True))
    cache.keep(torch.tensor([2, 4]))
    outs.append(cache.run(torch.randint(4, vocab, (2, 1), generator=gen), logits_to_keep=1))
    cache.keep(torch.tensor([1, 1]))
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    outs.append(cache.run_tree(torch.randint(4, vocab, (2, 4), generator=gen), torch.tensor([0, 1, 1, 2]), tree,
                               logits_to_keep=4, output_hidden_states=True))
    return [(o.logits.float(), [h.float() for h in o.hidden_states or ()]) for o in outs]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_passes_match_transformers(name, dtype):
    model = MODELS[name].to(dtype)
    try:
        with torch.inference_mode(), fused_projections(model):
            got, want = passes(model, True, dtype), passes(model, False, dtype)
    finally:
        model.float()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for (gl, gh), (wl, wh) in zip(got, want):
        torch.testing.assert_close(gl, wl, atol=tol, rtol=tol)
        assert len(gh) == len(wh)
        for a, b in zip(gh, wh):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", list(MODELS))
def test_decodes_match_transformers(name):
    model = MODELS[name]
    prompts = [[5, 9, 11, 4, 7, 5, 9, 11], [3, 8, 3, 8, 3]]
    runs = {}
    for on in (True, False):
        compact.ENABLED = on
        try:
            runs[on] = [decode.generate(model, prompts, max_new_tokens=24, drafter=d, num_draft_tokens=3,
                                        tree=tree).sequences
                        for d, tree in ((None, None), (NGramDrafter(), None), (NGramDrafter(), "2,1,1"))]
        finally:
            compact.ENABLED = True
    assert runs[True] == runs[False]
    assert runs[True][0] == runs[True][1] == runs[True][2]  # greedy speculation keeps plain decoding's tokens


def test_uncovered_models_say_why():
    assert "sliding" in compact.compact_problem(build_family("mistral")[0])
    assert "model_type 'gemma2'" in compact.compact_problem(build_family("gemma2")[0])
    model = tiny_llama(0)
    model.config._attn_implementation = "eager"
    assert "'eager'" in compact.compact_problem(model)
    model = tiny_llama(0)
    model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert compact.compact_problem(model) == "a decoder layer has hooks"
    assert compact.compact_problem(tiny_llama(0)) is None
