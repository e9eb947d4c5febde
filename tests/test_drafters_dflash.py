"""DFlash block drafter: the training pass is the decoder's block, the context cache re-syncs, configs refuse
what vLLM cannot serve, tensor names are vLLM's ``qwen3_dflash`` loader's."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_drafters_conformance import build

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter, default_feature_layers


def _features(target, ids, layers):
    out = target(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)  # [T, nF*H]


def _state(tokens, feats, stable=0, vocab=128):
    return DecodeState(tokens=[list(tokens)], num_stable=[stable], features=[feats], active=[True], vocab_size=vocab)


@pytest.mark.parametrize("kind", ["dflash", "dflash_reduced"])
def test_first_proposed_block_equals_the_training_forward(kind):
    """forward() with anchor a is the block propose() drafts after the prefix tokens[:a+1] (same logits)."""
    target = tiny_llama(0)
    d = build(kind, target)
    ids = [5, 9, 17, 33, 2, 70, 71, 72, 90, 11, 12]
    feats = _features(target, ids, d.feature_layers)
    anchors = torch.tensor([[1, 4, 7, -1]])
    with torch.no_grad():
        logits = d(torch.tensor([ids]), feats[None], anchors)  # [1, 4, B-1, N]
    assert logits.shape[:3] == (1, 4, d.config.block_size - 1)
    for i, a in enumerate(anchors[0].tolist()[:3]):
        d.reset(1)
        with torch.no_grad():
            block = d.block_logits([0], [ids[:a + 1]], [feats[:a]], [0])[0]
        torch.testing.assert_close(block, logits[0, i], rtol=1e-4, atol=1e-4)
        d.reset(1)
        prop = d.propose(_state(ids[:a + 1], feats[:a]), d.config.block_size - 1, SamplingParams(), None)
        best = logits[0, i].argmax(-1)
        want = best if d.draft_ids() is None else d.draft_ids()[best]
        assert prop.tokens[0].tolist() == want.tolist()


def test_context_cache_resyncs_with_num_stable():
    """Cached context rows past num_stable are recomputed: a reused drafter drafts as a fresh one."""
    target = tiny_llama(0)
    d = build("dflash", target)
    a, b = [5, 9, 17, 33, 2, 70, 71], [5, 9, 17, 40, 41, 42, 43, 44]
    fa, fb = _features(target, a, d.feature_layers), _features(target, b, d.feature_layers)
    d.reset(1)
    d.propose(_state(a, fa[:-1]), 3, SamplingParams(), None)
    reused = d.propose(_state(b, fb[:-1], stable=3), 3, SamplingParams(), None).tokens
    d.reset(1)
    fresh = d.propose(_state(b, fb[:-1]), 3, SamplingParams(), None).tokens
    assert torch.equal(reused, fresh)


def test_rows_of_different_lengths_draft_together_as_alone():
    """One block pass over rows with contexts of different lengths (padded, masked) gives each row the
    logits of its own pass."""
    target = tiny_llama(0)
    d = build("dflash_reduced", target)
    rows = [[5, 9, 17, 33, 2, 70, 71], [40, 41], [7, 8, 9, 10]]
    feats = [_features(target, r, d.feature_layers)[:-1] for r in rows]
    d.reset(3)
    with torch.no_grad():
        together = d.block_logits([0, 1, 2], rows, feats, [0, 0, 0])
        for b in range(3):
            d.reset(3)
            alone = d.block_logits([b], rows, feats, [0, 0, 0])[0]
            torch.testing.assert_close(alone, together[b], rtol=1e-4, atol=1e-4)


def test_chain_is_capped_at_block_size_minus_one():
    target = tiny_llama(0)
    d = build("dflash", target)  # block_size 4: 3 draft tokens per pass
    ids = [5, 9, 17, 33, 2]
    d.reset(1)
    prop = d.propose(_state(ids, _features(target, ids, d.feature_layers)[:-1]), 6, SamplingParams(), None)
    assert prop.tokens.shape == (1, 6) and prop.lengths.tolist() == [3]
    prop = d.propose(_state(ids, _features(target, ids, d.feature_layers)[:-1]), 2, SamplingParams(), None)
    assert prop.lengths is None


def test_a_pass_asked_for_k_tokens_runs_the_block_vllm_runs_at_k():
    """vLLM drafts with the block ``[bonus, mask x K]`` (K = num_speculative_tokens). A pass asked for K < B-1
    draft tokens runs that block: the logits and drafts of a drafter with the same weights and
    ``block_size = K + 1``; the trained block (B-1 mask slots) gives other logits at the same positions, since
    every block position attends every other. ``mask_slots`` fixes the block instead."""
    from dataclasses import replace

    target = tiny_llama(0)
    d = build("dflash_reduced", target)  # block_size 4
    short = DFlashDrafter(replace(d.config, block_size=3), target=target)
    short.load_state_dict(d.state_dict())
    ids = [5, 9, 17, 33, 2, 70, 71]
    feats = _features(target, ids, d.feature_layers)[:-1]
    assert d.mask_slots is None and [d.slots_for(k) for k in (1, 2, 3, 5)] == [1, 2, 3, 3]
    with torch.no_grad():
        d.reset(1)
        full = d.block_logits([0], [ids], [feats], [0])[0]  # [3, N]: the trained block
        d.reset(1)
        two = d.block_logits([0], [ids], [feats], [0], slots=2)[0]  # [2, N]
        short.reset(1)
        want = short.block_logits([0], [ids], [feats], [0])[0]
    assert two.shape == want.shape == (2, d.config.draft_vocab_size)
    torch.testing.assert_close(two, want, rtol=1e-5, atol=1e-5)
    assert (full[:2] - two).abs().max() > 1e-3  # one mask slot more moves every position
    d.reset(1)
    short.reset(1)
    sampling = SamplingParams(temperature=1.0)
    ours = d.propose(_state(ids, feats), 2, sampling, torch.Generator().manual_seed(0))
    theirs = short.propose(_state(ids, feats), 2, sampling, torch.Generator().manual_seed(0))
    assert ours.lengths is None and torch.equal(ours.tokens, theirs.tokens)
    torch.testing.assert_close(ours.probs, theirs.probs, rtol=1e-5, atol=1e-6)
    d.reset(1)  # a round near the end asks fewer tokens than the decoding's K and still runs K's block
    last = _state(ids, feats)
    last.num_draft_tokens = 2
    one = d.propose(last, 1, sampling, torch.Generator().manual_seed(0))
    torch.testing.assert_close(one.probs[:, 0], theirs.probs[:, 0], rtol=1e-5, atol=1e-6)
    d.mask_slots = 2  # fixed: a pass asked for 3 runs 2 slots and caps the chain there
    assert d.slots_for(3) == 2 and d.slots_for(1) == 2
    d.reset(1)
    prop = d.propose(_state(ids, feats), 3, SamplingParams(), None)
    assert prop.lengths.tolist() == [2]
    for bad in (0, 4, True, 2.0):
        with pytest.raises(ValueError, match=r"mask_slots must be None or an int in \[1, 3\]"):
            d.mask_slots = bad
    d.mask_slots = None
    assert d.mask_slots is None and d.slots_for(9) == 3


def test_config_refuses_layers_and_sizes_vllm_cannot_serve():
    assert default_feature_layers(30) == [2, 15, 28]
    assert default_feature_layers(2) == [1]
    base = dict(vocab_size=64, hidden_size=32, target_num_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, intermediate_size=64)
    for bad in ([0, 1], [1, 4], [2, 1], [1, 1]):
        with pytest.raises(ValueError, match=r"distinct increasing hidden_states ids in \[1, 3\]"):
            DFlashConfig(**base, feature_layers=bad)
    with pytest.raises(ValueError, match="block_size >= 2"):
        DFlashConfig(**base, block_size=1)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig(**base, mask_token_id=64)
    assert DFlashConfig(**base).draft_vocab_size == 64


def test_tensor_names_are_the_vllm_loader_names():
    """What vLLM's DFlashQwen3ForCausalLM.load_weights reads (model_executor/models/qwen3_dflash.py): names
    without "model." (it adds it), q/k/v and gate/up unstacked, lm_head / d2t only for a reduced vocabulary."""
    target = tiny_llama(0)
    full, reduced = build("dflash", target), build("dflash_reduced", target)
    layer = {f"layers.{{i}}.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
    layer |= {f"layers.{{i}}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
    layer |= {"layers.{i}.input_layernorm.weight", "layers.{i}.post_attention_layernorm.weight"}
    top = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    want = top | {n.format(i=i) for n in layer for i in range(2)}
    assert set(full.own_state_dict()) == want
    assert set(reduced.own_state_dict()) == top | {n.format(i=0) for n in layer} | {"lm_head.weight", "d2t", "t2d"}


def test_needs_the_target():
    target = tiny_llama(0)
    with pytest.raises(ValueError, match="borrows the target's embedding"):
        DFlashDrafter(DFlashConfig.from_target(target))


def test_anchors_are_supervised_positions_with_context():
    from drafterkit.train.strategies.dflash import sample_anchors

    labels = torch.full((3, 10), -100)
    labels[0, 4:9] = 7  # 5 candidates, 3 drawn
    labels[1, 0:3] = 7  # position 0 has no context: 2 candidates
    anchors = sample_anchors(labels, 3, torch.Generator().manual_seed(0))
    assert anchors.shape == (3, 3)
    row0 = anchors[0].tolist()
    assert row0 == sorted(row0) and len(set(row0)) == 3 and all(4 <= a <= 8 for a in row0)
    assert anchors[1].tolist() == [1, 2, -1] and anchors[2].tolist() == [-1, -1, -1]


def test_training_raises_measured_acceptance_on_what_it_trained_on():
    """60 optimizer steps of the DFlash strategy's loss on the tiny target's greedy continuations raise the
    acceptance decode.generate measures when continuing those prompts (well above the untrained drafter's):
    the blocks the loss trains are the blocks the decoder drafts. The target is untouched and nothing
    borrowed is saved."""
    from conftest import acceptance_before_after, greedy_continuation_batch

    from drafterkit.train.recipe import recipe_from_dict
    from drafterkit.train.strategies.dflash import DFlashStrategy

    target = tiny_llama(0)
    before_t = {k: v.clone() for k, v in target.state_dict().items()}
    batch, _ = greedy_continuation_batch(target)
    prompts = batch["input_ids"][:8, :4].tolist()
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"}, "drafter": {
        "kind": "dflash", "options": {"block_size": 4, "num_layers": 2, "num_anchors": 32}}})
    torch.manual_seed(0)
    d = DFlashDrafter(DFlashStrategy().config(recipe, target), target=target)
    before, after = acceptance_before_after("dflash", d, target, batch, recipe, prompts, k=3, lr=1e-2, steps=60)
    assert after > 0.2 and after > before + 0.15, (before, after)
    assert all(torch.equal(before_t[k], v) for k, v in target.state_dict().items())
    assert not any(k.startswith("embed_tokens.") for k in d.own_state_dict())


def test_dflash_behind_prompt_lookup_drafts_chains_and_eval_measures_it_so():
    """A hybrid has propose_tree, but with a chain-only drafter inside it drafts chains: eval's tree rows and
    tune's tree candidates skip it instead of failing at the first tree."""
    from drafterkit.drafters.lookup.hybrid import LookupHybrid, drafts_trees
    from drafterkit.speceval.tune_search import candidates

    target = tiny_llama(0)
    d = build("dflash", target)
    hybrid = LookupHybrid(d)
    assert not drafts_trees(d) and not drafts_trees(hybrid) and not drafts_trees(hybrid, "propose_dynamic_tree")
    got = candidates(hybrid, [3], ["2,1"], ["dynamic:4:2:2"], [0.0])
    assert [c.label for c in got] == ["chain K=3"]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_one_propose_serves_both_block_kinds_and_names_the_kind(kind):
    """DSpark drafts through DFlash's ``propose`` (one preamble: rows, slots, padding), adding only its sequential
    stage (``draft_rows``); the refusal of a decoder that passed no features names the drafter's own kind."""
    from drafterkit.drafters.dspark import DSparkDrafter

    assert "propose" not in DSparkDrafter.__dict__ and "draft_rows" in DSparkDrafter.__dict__
    d = build(kind, tiny_llama(0)).eval()
    state = DecodeState(tokens=[[5, 6, 7]], num_stable=[0], features=None, active=[True], vocab_size=128)
    with pytest.raises(ValueError, match=rf"^{kind} needs target features"):
        d.propose(state, 3, SamplingParams(), None)
