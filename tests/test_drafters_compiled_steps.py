"""drafters.heads.compiled_steps: an EAGLE-family head's drafting passes compiled compute what its eager passes do.

On a tiny seeded EAGLE-3 head (two layers, a reduced draft vocabulary) over the tests' GQA Llama, in fp32: a first
catch-up, a chain's drafting step and a tree level give the same outputs, keys/values and draft logits compiled and
eager; greedy decodes (a chain, a static tree, a dynamic tree) give the same tokens, for the EAGLE-3 head and a
P-EAGLE head (one drafting pass per round); a decode in compiled mode leaves the head out of the engine's fused
layers (its graph freezes its own); changed weights rebuild the graph; :func:`decode.warm.warm_up_proposer` compiles
every graph a batch-1 decode uses. Compiling takes tens of seconds.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from drafterkit import decode
from drafterkit.decode import compiled, warm
from drafterkit.decode.inputs import proposer_modules
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.heads.layers import causal_mask
from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter

PROMPTS = [[5, 9, 11, 4, 7, 5, 9, 11, 4]]

DECODES = (None, "2,1", "dynamic:4:2:2")


def world(seed: int = 6, kind: str = "eagle3"):
    target = tiny_llama(seed, hidden_size=64, heads=4, kv_heads=2, layers=2)
    torch.manual_seed(seed)
    config, cls = (Eagle3Config, Eagle3Drafter) if kind == "eagle3" else (PEagleConfig, PEagleDrafter)
    head = cls(config.from_target(target, draft_vocab_size=48, num_layers=2), target).eval()
    head.set_draft_vocab(torch.arange(48) * 2, target)
    return target, head


def passes(head):
    """A first catch-up (5 real positions), a chain's drafting step, a tree level of 3 nodes."""
    gen = torch.Generator().manual_seed(0)
    width, hidden = 3 * head.config.hidden_size, head.config.hidden_size
    ids = torch.randint(0, 100, (1, 5), generator=gen)
    out = [head._pass(ids, torch.randn(1, 5, width, generator=gen), torch.arange(5)[None], causal_mask(5, 0), None,
                      real=True, keep=1)]
    past = out[-1][1]
    out.append(head._pass(ids[:, :1], torch.randn(1, 1, hidden, generator=gen), torch.tensor([[5]]),
                          causal_mask(1, 5), past))
    tree = torch.cat([torch.ones(3, 5, dtype=torch.bool), torch.eye(3, dtype=torch.bool)], 1)
    out.append(head._pass(ids[:, :3], torch.randn(1, 3, hidden, generator=gen), torch.full((1, 3), 6), tree, past,
                          keep=0))
    return out


def flat(result):
    out, kv, logits = result
    return [out, logits, *(t for layer in kv for t in layer)]


@pytest.mark.slow  # torch.compile: tens of seconds per graph
def test_compiled_drafting_passes_and_decodes_match_eager():
    target, head = world()
    runs = {}
    for on in (False, True):
        with decode.compiled_mode(on), torch.inference_mode():
            runs[on] = [flat(r) for r in passes(head)]
    assert compiled._modules[head] is not None  # compiled, not fallen back to the eager passes
    for eager, built in zip(runs[False], runs[True]):
        for a, b in zip(eager, built):
            torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)
    for tree in DECODES:
        outs = {}
        for on in (False, True):
            with decode.compiled_mode(on):
                assert proposer_modules(head) == ([] if on else [head])  # compiled: its own graph, not fused
                res = decode.generate(target, PROMPTS, max_new_tokens=16, drafter=head, num_draft_tokens=3,
                                      tree=tree)
                outs[on] = res.sequences, res.counts.accepted_at  # the same drafts accepted: the same drafts
        assert outs[True] == outs[False], tree


@pytest.mark.slow
def test_changed_weights_rebuild_the_graph():
    target, head = world(7)
    with decode.compiled_mode():
        decode.generate(target, PROMPTS, max_new_tokens=6, drafter=head, num_draft_tokens=3)
        first = compiled._modules[head]
        with torch.no_grad():
            head.lm_head.weight.mul_(-1.5)  # a training step between two evaluations
        decode.generate(target, PROMPTS, max_new_tokens=6, drafter=head, num_draft_tokens=3)
        assert compiled._modules[head] is not first
        with torch.inference_mode():
            built = [flat(r) for r in passes(head)]
    with torch.inference_mode():
        eager = [flat(r) for r in passes(head)]
    for a, b in zip(eager, built):
        for x, y in zip(a, b):
            torch.testing.assert_close(y, x, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_a_peagle_head_decodes_compiled_as_eager():
    target, head = world(9, "peagle")
    for tree in (None, "2,1"):
        outs = {}
        for on in (False, True):
            with decode.compiled_mode(on):
                outs[on] = decode.generate(target, PROMPTS, max_new_tokens=16, drafter=head, num_draft_tokens=5,
                                           tree=tree).sequences
        assert outs[True] == outs[False], tree
    assert compiled._modules[head] is not None


@pytest.mark.slow
@pytest.mark.parametrize("kind,k", [("eagle3", 3), ("peagle", 5)])
def test_warm_up_compiles_every_drafting_graph_a_batch_one_decode_uses(kind, k):
    target, head = world(8, kind)
    with decode.compiled_mode():
        warm.warm_up(target, (True,))
        assert warm.warm_up_proposer(head) > 0
        with torch._dynamo.config.patch(error_on_recompile=True):  # a compile now fails the graph: eager from then
            for tree in DECODES if kind == "eagle3" else (None,):
                for prompt in (PROMPTS[0], PROMPTS[0][:2], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]):
                    decode.generate(target, [prompt], max_new_tokens=12, drafter=head, num_draft_tokens=k, tree=tree)
            if kind == "peagle":  # a chain all accepted: its k + 1 new real positions and k - 1 masked ones (every
                # input through fc in the graph: features and mask_hidden)
                width = 3 * head.config.hidden_size
                with torch.inference_mode():
                    _, past = head._layer(torch.ones(1, 9, dtype=torch.long), head.real_input(torch.zeros(1, 9, width)),
                                          torch.arange(9)[None], causal_mask(9, 0), None)
                    head._pass(torch.ones(1, 2 * k, dtype=torch.long), torch.zeros(1, 2 * k, width),
                               torch.arange(9, 9 + 2 * k)[None], causal_mask(2 * k, 9), past, real=True, keep=k)
        assert compiled._modules[head] is not None  # nothing compiled while decoding
    assert warm.warm_up_proposer(head) < 0.5  # compiled mode off: nothing to compile


@pytest.mark.slow
def test_a_cut_back_cache_and_a_row_of_a_wider_output_reuse_the_warm_graphs():
    """A decode hands the head views: its cache cut back after rejected drafts (a view into the longer cache) and the
    last row of a pass's output; their strides are not a new tensor's, and must not compile the graphs again."""
    _, head = world(10)
    width = 3 * head.config.hidden_size
    with decode.compiled_mode(), torch.inference_mode():
        assert warm.warm_up_proposer(head) > 0
        with torch._dynamo.config.patch(error_on_recompile=True):  # a compile now fails the graph: eager from then
            _, past, _ = head._pass(torch.ones(1, 9, dtype=torch.long), torch.zeros(1, 9, width),
                                    torch.arange(9)[None], causal_mask(9, 0), None, real=True)
            cut = tuple((k[:, :, :6], v[:, :, :6]) for k, v in past)  # two of three drafts rejected
            out, past, _ = head._pass(torch.ones(1, 2, dtype=torch.long), torch.zeros(1, 2, width),
                                      torch.arange(6, 8)[None], causal_mask(2, 6), cut, real=True)
            head._pass(torch.ones(1, 1, dtype=torch.long), out[:, -1][:, None], torch.tensor([[8]]),
                       causal_mask(1, 8), past)
    assert compiled._modules[head] is not None  # nothing compiled again (a compile fails the graph)
