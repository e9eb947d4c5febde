"""Drafters started from the target's layers, per family (``drafters.target.layers``): what maps computes what
the target's part computes (fused projections split, Gemma's ``1 + weight`` norms, the pre-MLP norm found by
role), what does not map (post-norms, experts) keeps its default init, and a target none of whose layers maps
starts the drafter fresh, said in one line naming the family and the option. Tiny seeded random targets of each
family (``tests/families.py``)."""

from __future__ import annotations

import pytest
import torch
from families import FAMILIES, build_family

from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter, copy_final_norm
from drafterkit.drafters.target.layers import decoder_layers, fresh_init_note, llama_layer_tensors
from drafterkit.train.strategies.dflash import init_layers_from_target
from drafterkit.train.strategies.eagle3 import init_split_attention_from_target

DENSE_SILU = {"llama3", "qwen2", "qwen3", "mistral", "phi3", "olmo2", "granite"}  # the head's SiLU MLP is theirs
MOE = {"qwen3_moe", "gpt_oss"}
POST_NORM = {"olmo2"}


def _x(width: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(3, width, generator=torch.Generator().manual_seed(seed))


def _qkv(attn, x: torch.Tensor) -> torch.Tensor:
    """The target attention's q, k, v rows for input ``x``, concatenated (fused or not)."""
    if hasattr(attn, "qkv_proj"):
        return attn.qkv_proj(x)
    return torch.cat([x @ attn.q_proj.weight.t(), x @ attn.k_proj.weight.t(), x @ attn.v_proj.weight.t()], -1)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_eagle3_head_starts_from_the_last_layer_of_every_family(family):
    target, _ = build_family(family)
    last = decoder_layers(target)[-1]
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64), target=target)
    fresh = {k: v.clone() for k, v in head.layer.state_dict().items()}
    from drafterkit.drafters.heads.feature_head import init_layer_from_target

    init_layer_from_target(head.layer, target)
    init_split_attention_from_target(head.layer, target)
    h = target.config.hidden_size
    x = _x(h)
    with torch.no_grad():
        # attention: both halves of the 2H-wide q/k/v are the target's q/k/v (split from Phi-3's qkv_proj)
        attn = head.layer.self_attn
        mine = torch.cat([attn.q_proj(torch.cat([x, 0 * x], -1)), attn.k_proj(torch.cat([0 * x, x], -1)),
                          attn.v_proj(torch.cat([x, 0 * x], -1))], -1)
        assert torch.allclose(mine, _qkv(last.self_attn, x), atol=1e-6)
        assert torch.equal(attn.o_proj.weight, last.self_attn.o_proj.weight)
        if family in POST_NORM:  # OLMo-2 normalises after attention / MLP: nothing maps, ones stay
            for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
                assert torch.equal(getattr(head.layer, name).weight, torch.ones(h)), name
        else:  # the head's norms compute the target's (Gemma's 1 + weight included)
            assert torch.allclose(head.layer.input_layernorm(x), last.input_layernorm(x), atol=1e-5)
            assert torch.allclose(head.layer.hidden_norm(x), last.input_layernorm(x), atol=1e-5)
            pre_mlp = getattr(last, "pre_feedforward_layernorm", None) or last.post_attention_layernorm
            assert torch.allclose(head.layer.post_attention_layernorm(x), pre_mlp(x), atol=1e-5)
        if family in DENSE_SILU:  # the same MLP function (Phi-3's gate_up_proj split)
            assert torch.allclose(head.layer.mlp(x), last.mlp(x), atol=1e-5)
        elif family in MOE:  # experts have no dense MLP to copy: default init kept
            for name in ("gate_proj", "up_proj", "down_proj"):
                assert torch.equal(getattr(head.layer.mlp, name).weight, fresh[f"mlp.{name}.weight"])
        else:  # Gemma: same weights, its own activation
            assert torch.equal(head.layer.mlp.gate_proj.weight, last.mlp.gate_proj.weight)


@pytest.mark.parametrize("family", ["phi3", "olmo2", "gemma3", "qwen3_moe"])
def test_eagle_and_dflash_start_from_the_target_on_fused_and_post_norm_layouts(family):
    target, _ = build_family(family)
    layers = decoder_layers(target)
    head = EagleDrafter(EagleConfig.from_target(target), target=target, init_from_target=True)
    assert torch.equal(head.layer.self_attn.o_proj.weight, layers[-1].self_attn.o_proj.weight)
    dflash = DFlashDrafter(DFlashConfig.from_target(target, num_layers=2, block_size=4), target=target)
    init_layers_from_target(dflash, target)
    x = _x(target.config.hidden_size)
    for mine, theirs in zip(dflash.layers, layers[-2:]):
        with torch.no_grad():
            got = torch.cat([mine.self_attn.q_proj(x), mine.self_attn.k_proj(x), mine.self_attn.v_proj(x)], -1)
            assert torch.allclose(got, _qkv(theirs.self_attn, x), atol=1e-6)
            if hasattr(theirs.self_attn, "q_norm") and family != "olmo2":  # per-head q/k norms map
                d = mine.self_attn.head_dim
                assert torch.allclose(mine.self_attn.q_norm(x[:, :d]), theirs.self_attn.q_norm(x[:, :d]), atol=1e-5)
            else:  # OLMo-2's q/k norms span all heads: the per-head ones stay at ones
                assert torch.equal(mine.self_attn.q_norm.weight, torch.ones_like(mine.self_attn.q_norm.weight))


def test_the_final_norm_starts_at_the_targets_effective_scale():
    # Gemma's final norm is (1 + weight) * x: a head copying the raw weight would start near zero.
    target, _ = build_family("gemma2")
    with torch.no_grad():
        target.model.norm.weight.normal_()
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64), target=target)
    copy_final_norm(head, target)
    x = _x(target.config.hidden_size)
    assert torch.allclose(head.norm(x), target.model.norm(x), atol=1e-5)


def test_a_target_without_mappable_attention_starts_the_drafter_fresh_in_one_line():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64)
    torch.manual_seed(0)
    target = GPTNeoXForCausalLM(cfg)
    assert fresh_init_note(target, "eagle") == (
        "drafter.options.init_from_target_layer: the eagle drafter's layers start fresh (default init): no "
        "GPTNeoXLayer has q/k/v (or qkv_proj) and o_proj projections to copy in this gpt_neox target; set "
        "drafter.options.init_from_target_layer=false to say so")
    torch.manual_seed(1)
    fresh = EagleDrafter(EagleConfig.from_target(target), target=target).layer.state_dict()
    torch.manual_seed(1)
    asked = EagleDrafter(EagleConfig.from_target(target), target=target, init_from_target=True).layer.state_dict()
    assert all(torch.equal(asked[k], v) for k, v in fresh.items())  # nothing copied, nothing raised
    with pytest.raises(ValueError, match=r"GPTNeoXLayer has no q/k/v \(or qkv_proj\)"):
        llama_layer_tensors(decoder_layers(target)[-1], cfg)
    for family in FAMILIES:
        assert fresh_init_note(build_family(family)[0], "x") is None, family


def test_a_target_without_a_llama_body_is_refused_for_the_feature_kinds():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from drafterkit.drafters.target.layers import feature_refusal

    target = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64))
    assert feature_refusal(target, "eagle3") == (
        "drafter.kind: drafter kind 'eagle3' reads the target's hidden states through model.embed_tokens / "
        "model.layers / model.norm, and model type 'gpt_neox' (GPTNeoXForCausalLM) has no model.embed_tokens; "
        "set drafter.kind=draft_lm (a draft model over the same tokenizer)")
    for family in FAMILIES:
        assert feature_refusal(build_family(family)[0], "eagle3") is None, family

