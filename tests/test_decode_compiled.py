"""decode.compiled: the target's passes compiled by torch.compile compute what the compact forward computes.

On tiny seeded random targets (the tests' GQA Llama; Qwen3 with its q/k norms; Qwen2 with its q/k/v biases): the
same passes through ``decode.cache.RaggedCache`` with compiled passes on and off give the same logits and hidden
states in fp32 (a chain pass with rejections, a decoding step, a tree pass); whole greedy decodes, plain and
speculative, give the same tokens; a model the compact forward does not cover runs uncompiled, as before.
Compiling takes tens of seconds per graph on two cores: the models are small and the graphs few.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from families import build_family
from drafterkit import decode
from drafterkit.decode import compiled, few_rows, warm
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.fused import fused_projections
from drafterkit.drafters.ngram import NGramDrafter

MODELS = {"gqa-llama": tiny_llama(5, hidden_size=64, heads=4, kv_heads=2, layers=2),
          "qwen3": build_family("qwen3", num_hidden_layers=2)[0],
          "qwen2": build_family("qwen2", num_hidden_layers=2)[0]}


def passes(model):
    cache = RaggedCache(model, 2, torch.device("cpu"), capacity=8, compiled=compiled.ENABLED)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    outs = [cache.prefill([[5, 9, 11, 4, 7], [3, 8]], logits_to_keep=1)]
    outs.append(cache.run(torch.randint(4, vocab, (2, 4), generator=gen), logits_to_keep=4,
                          output_hidden_states=True))
    cache.keep(torch.tensor([2, 4]))
    outs.append(cache.run(torch.randint(4, vocab, (2, 1), generator=gen), logits_to_keep=1))
    cache.keep(torch.tensor([1, 1]))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs.append(cache.run_tree(torch.randint(4, vocab, (2, 3), generator=gen), torch.tensor([0, 1, 1]), tree,
                               logits_to_keep=0))  # 0: every new column's logits
    return [(o.logits, o.hidden_states or ()) for o in outs]


@pytest.mark.slow  # torch.compile: tens of seconds per graph
@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_passes_match_eager(name):
    model = MODELS[name]
    with torch.inference_mode(), fused_projections(model):
        with decode.compiled_mode():
            got = passes(model)
        want = passes(model)
    assert compiled._compiled.get(model) is not None  # it compiled, and did not fall back
    for (gl, gh), (wl, wh) in zip(got, want):
        torch.testing.assert_close(gl, wl, atol=1e-5, rtol=1e-5)
        assert len(gh) == len(wh)
        for a, b in zip(gh, wh):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # torch.compile: tens of seconds per graph
def test_compiled_bf16_passes_match_eager_to_bf16_rounding():
    """bf16: a few rows' linear layers run decode.few_rows' kernel where the CPU has AVX-512 BF16 or AVX2 (its sums in
    another order than oneDNN's), so passes agree up to bf16 rounding, not bit for bit."""
    model = tiny_llama(5, hidden_size=64, heads=4, kv_heads=2, layers=2).to(torch.bfloat16)
    with torch.inference_mode(), fused_projections(model):
        with decode.compiled_mode():
            got = passes(model)
        want = passes(model)
    built = compiled._compiled.get(model)
    assert built is not None
    assert (built._orig_mod.layers[0].qkv.packed is not None) == few_rows.available()
    for (gl, gh), (wl, wh) in zip(got, want):
        torch.testing.assert_close(gl.float(), wl.float(), atol=0.03, rtol=0.03)
        for a, b in zip(gh, wh):
            torch.testing.assert_close(a.float(), b.float(), atol=0.03, rtol=0.03)


@pytest.mark.slow  # torch.compile: tens of seconds per graph
def test_compiled_decodes_match_eager():
    model = MODELS["gqa-llama"]
    prompts = [[5, 9, 11, 4, 7, 5, 9, 11], [3, 8, 3, 8, 3]]
    runs = {}
    for on in (True, False):
        with decode.compiled_mode(on):
            runs[on] = [decode.generate(model, prompts, max_new_tokens=20, drafter=d, num_draft_tokens=3).sequences
                        for d in (None, NGramDrafter())]
    assert runs[True] == runs[False]
    assert runs[True][0] == runs[True][1]


def test_uncovered_model_runs_uncompiled():
    model = build_family("gemma2")[0]
    prompt = [[5, 9, 11, 4]]
    with decode.compiled_mode():
        got = decode.generate(model, prompt, max_new_tokens=6).sequences
    assert model not in compiled._compiled  # never built: the compact forward refuses it
    assert got == decode.generate(model, prompt, max_new_tokens=6).sequences


def test_a_head_that_is_not_a_plain_linear_runs_uncompiled(capsys):
    """The graph computes the LM head from its weight; a head that does more (here a hook scaling the logits, as a
    wrapper or adapter would) keeps the model's forward, said once."""
    model = tiny_llama(7, hidden_size=64, heads=4, kv_heads=2, layers=2)
    model.lm_head.register_forward_hook(lambda mod, args, out: out * 2)
    prompt = [[5, 9, 11, 4]]
    want = decode.generate(model, prompt, max_new_tokens=6).sequences
    with decode.compiled_mode():
        got = decode.generate(model, prompt, max_new_tokens=6).sequences
    assert compiled._compiled.get(model, "unbuilt") is None and got == want
    assert "the LM head is not a plain nn.Linear without hooks" in capsys.readouterr().err


@pytest.mark.slow  # torch.compile: tens of seconds per graph
def test_compiled_passes_write_the_cache_in_place():
    """After the first compiled pass the layers' keys and values stay views of one set of buffers: a chain pass
    with rejections, a decoding step and a tree pass with its reordering write their columns in place."""
    model = MODELS["gqa-llama"]
    cache = RaggedCache(model, 2, torch.device("cpu"), capacity=64, compiled=True)
    seen = []
    with torch.inference_mode(), fused_projections(model), decode.compiled_mode():
        cache.prefill([[5, 9, 11, 4, 7], [3, 8]], logits_to_keep=1)
        cache.run(torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]]), logits_to_keep=4)
        cache.keep(torch.tensor([2, 4]))
        seen.append(compiled._kv_buffers[cache.cache])
        cache.run(torch.tensor([[12], [13]]), logits_to_keep=1)
        cache.keep(torch.tensor([1, 1]))
        seen.append(compiled._kv_buffers[cache.cache])
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        cache.run_tree(torch.tensor([[14, 15, 16], [17, 18, 19]]), torch.tensor([0, 1, 1]), tree, logits_to_keep=3)
        cache.reorder(torch.tensor([[0, 2], [0, 1]]))
        cache.keep(torch.tensor([2, 1]))
        seen.append(compiled._kv_buffers[cache.cache])
    keys, values = seen[0]
    assert all(s is seen[0] for s in seen) and keys[0].shape[2] >= 64  # allocated once, at the cache's capacity
    for layer, kb, vb in zip(cache.cache.layers, keys, values):
        assert layer.keys.data_ptr() == kb.data_ptr() and layer.values.data_ptr() == vb.data_ptr()
        assert layer.keys.shape[2] == cache.length == 5 + 4 + 1 + 2


def test_mode_restores():
    assert not compiled.ENABLED
    with decode.compiled_mode():
        assert compiled.ENABLED
        with decode.compiled_mode(False):
            assert not compiled.ENABLED
        assert compiled.ENABLED
    assert not compiled.ENABLED


@pytest.mark.slow  # torch.compile: tens of seconds per graph
def test_warm_up_compiles_every_graph_a_batch_one_decode_uses():
    model = tiny_llama(6, hidden_size=64, heads=4, kv_heads=2, layers=2)
    with decode.compiled_mode():
        assert warm.warm_up(model) > 0
        with torch._dynamo.config.patch(error_on_recompile=True):  # a compile now fails the passes: eager from then
            for d, tree in ((None, None), (NGramDrafter(), None), (NGramDrafter(), "2,1")):
                decode.generate(model, [[5, 9, 11, 4, 7, 5, 9, 11]], max_new_tokens=12, drafter=d,
                                num_draft_tokens=3, tree=tree)
        assert compiled._compiled.get(model) is not None  # nothing compiled while decoding
    assert warm.warm_up(model) == 0.0  # compiled mode off: nothing to compile
