"""drafters.draft_lm: truncated-target / wrapped draft LMs, strict save/load, cached proposals."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import tiny_llama
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import DrafterLoadError, load_drafter
from drafterkit.drafters.draft_lm import DraftLM, DraftLMConfig


def test_from_target_copies_first_layers():
    target = tiny_llama(0)
    d = DraftLM.from_target(target, 1)
    assert d.config.init == "truncated_target" and d.lm.config.num_hidden_layers == 1
    t_sd, d_sd = target.state_dict(), d.lm.state_dict()
    for key in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight",
                "lm_head.weight"):
        assert torch.equal(t_sd[key], d_sd[key])
    assert not any(k.startswith("model.layers.1.") for k in d_sd)
    x = torch.randint(3, 128, (2, 6))
    assert d(x).shape == (2, 6, 128)
    with pytest.raises(ValueError, match="num_layers"):
        DraftLM.from_target(target, 3)


def test_the_readable_config_records_the_targets_rope_theta():
    """config.json's Llama fields are read from the source model; rope_theta (under transformers 5's
    rope_parameters) used to stay at the dataclass default while the model ran the target's."""
    target = tiny_llama(0)
    theta = target.config.rope_parameters["rope_theta"]
    assert theta != DraftLMConfig.rope_theta  # the tiny target's differs from the default, so the check bites
    d = DraftLM.from_target(target, 1)
    assert d.config.rope_theta == theta == d.lm.config.rope_parameters["rope_theta"]


def test_scratch_config_builds_llama_and_validates():
    cfg = DraftLMConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_attention_heads=4,
                        num_key_value_heads=2)
    assert DraftLM(cfg)(torch.tensor([[1, 2, 3]])).shape == (1, 3, 64)
    with pytest.raises(ValueError, match="init"):
        DraftLMConfig(init="magic")


def test_save_load_roundtrip_is_exact_and_strict(tmp_path):
    d = DraftLM.from_target(tiny_llama(0), 2)
    d.save_pretrained(tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["kind"] == "draft_lm"
    loaded = load_drafter(tmp_path / "d")
    x = torch.randint(3, 128, (2, 9))
    assert torch.equal(d(x), loaded(x))
    state = load_file(str(tmp_path / "d" / "model.safetensors"))
    state.pop("lm.model.norm.weight")
    save_file(state, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="missing"):
        load_drafter(tmp_path / "d")


def _state(tokens, stable):
    return DecodeState(tokens=tokens, num_stable=stable, features=None, active=[True] * len(tokens),
                       vocab_size=128)


def test_cached_proposals_equal_uncached_greedy_and_resync():
    model = tiny_llama(1, layers=1)
    d = DraftLM.from_model(model)
    d.reset(2)
    rows = [[5, 6, 7, 8], [9, 10]]

    def reference(row, k):
        return model.generate(torch.tensor([row]), max_new_tokens=k, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(row):].tolist()

    p = d.propose(_state(rows, [0, 0]), 3, SamplingParams(), None)
    assert p.probs is None and p.tokens.tolist() == [reference(r, 3) for r in rows]
    grown = [rows[0] + [11, 12], rows[1] + [13]]  # committed tokens of different counts per row
    p = d.propose(_state(grown, [4, 2]), 4, SamplingParams(), None)
    assert p.tokens.tolist() == [reference(r, 4) for r in grown]
    changed = [grown[0][:3] + [40], grown[1]]  # num_stable below the cached length -> full re-sync
    p = d.propose(_state(changed, [3, 3]), 2, SamplingParams(), None)
    assert p.tokens.tolist() == [reference(r, 2) for r in changed]


def test_sampling_proposal_returns_q_of_sampled_tokens():
    d = DraftLM.from_model(tiny_llama(1, layers=1))
    d.reset(1)
    p = d.propose(_state([[5, 6, 7]], [0]), 3, SamplingParams(0.8, 10), torch.Generator().manual_seed(0))
    assert p.probs.shape == (1, 3, 128)
    assert torch.allclose(p.probs.sum(-1), torch.ones(1, 3))
    assert (p.probs.gather(-1, p.tokens[..., None]) > 0).all() and ((p.probs > 0).sum(-1) <= 10).all()
