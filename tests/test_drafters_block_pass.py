"""drafters.block_pass: a DFlash-family drafter's round compiled computes what its eager round does.

On tiny seeded DFlash and DSpark drafters (a reduced draft vocabulary; DSpark's Markov head non-zero) over the tests'
GQA Llama, in fp32: a compiled round gives the eager round's block outputs, draft logits and context cache; greedy
decodes give the same tokens and accept the same drafts compiled and eager; after :func:`decode.warm.warm_up_proposer`
decodes of short and long prompts compile nothing more (``error_on_recompile``). Compiling takes tens of seconds.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from drafterkit import decode
from drafterkit.decode import compiled, warm
from drafterkit.decode.protocol import SamplingParams
from drafterkit.drafters.block_pass import block_pass
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter

PROMPTS = ([5, 9, 11, 4, 7, 5, 9, 11, 4], [5, 9], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9])


def world(kind: str, seed: int = 6):
    target = tiny_llama(seed, hidden_size=64, heads=4, kv_heads=2, layers=4)
    torch.manual_seed(seed)
    config, cls = (DFlashConfig, DFlashDrafter) if kind == "dflash" else (DSparkConfig, DSparkDrafter)
    drafter = cls(config.from_target(target, block_size=6, draft_vocab_size=48), target).eval()
    drafter.set_draft_vocab(torch.arange(48) * 2, target)
    if kind == "dspark":  # its Markov head starts at zero: make the sequential stage matter
        torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)
    return target, drafter


@pytest.mark.slow  # torch.compile: tens of seconds per graph
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_a_compiled_round_gives_the_eager_rounds_outputs_and_cache(kind):
    _, d = world(kind)
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(14, d.fc.weight.shape[1], generator=gen)
    tokens = torch.randint(0, 100, (15,), generator=gen).tolist()
    runs = {}
    for on in (False, True):
        with decode.compiled_mode(on), torch.inference_mode():
            d.reset(1)
            d._context_rows([0], [feats[:9]], [9])  # an earlier round's context
            if on:
                got = block_pass(d, 0, tokens, feats, 7, 4)  # two context rows no longer stable
                assert got is not None
            else:
                got = d.block_outputs([0], [tokens], [feats], [7], 4)
            runs[on] = [*got, *(t for kv in d._caches[0]["kv"] for t in kv)]
    assert compiled._modules[d] is not None  # compiled, not fallen back to the eager code
    for eager, built in zip(runs[False], runs[True]):
        torch.testing.assert_close(built, eager, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("kind,k", [("dflash", 5), ("dspark", 3)])
def test_warm_decodes_match_eager_and_compile_nothing_more(kind, k):
    target, d = world(kind, 7)
    outs = {}
    for on in (False, True):
        with decode.compiled_mode(on):
            if on:
                warm.warm_up(target, (True,))
                assert warm.warm_up_proposer(d, k) > 0
            with torch._dynamo.config.patch(error_on_recompile=on):  # a compile now fails the graph: eager from then
                outs[on] = [(r.sequences, r.counts.accepted_at) for r in (
                    decode.generate(target, [p], max_new_tokens=16, drafter=d, num_draft_tokens=k) for p in PROMPTS)]
    assert compiled._modules[d] is not None  # nothing compiled while decoding
    assert outs[True] == outs[False]
    assert warm.warm_up_proposer(d, k) < 0.5  # compiled mode off: nothing to compile


@pytest.mark.parametrize("vocab", [100, 60])
def test_dsparks_greedy_chain_in_tensors_is_its_chains_greedy_choice(vocab):
    """What the compiled round drafts (``greedy_chain``) is what :meth:`DSparkDrafter.chain` drafts greedily, draft ids
    mapping past the target's vocabulary (60: some do) never drafted."""
    _, d = world("dspark", 8)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 4, d.config.hidden_size, generator=gen)
    prev = torch.tensor([3, 17])
    with torch.inference_mode():
        want, _, _ = d.chain(hidden, prev, 4, SamplingParams(), None, vocab)
        got = d.greedy_chain(d.draft_logits(hidden), prev, vocab)
    assert got.tolist() == want.tolist()
    assert got.max() < vocab
