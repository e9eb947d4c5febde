"""EAGLE-3 head: TTT mask, d2t/t2d mapping, TTT == decoding, reduced vocabulary buys acceptance."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import engine
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.eagle3 import (
    Eagle3Config,
    Eagle3Drafter,
    check_feature_layers,
    default_feature_layers,
    mapping_from_ids,
    select_draft_vocab,
)
from drafterkit.drafters.heads.layers import ttt_attention_mask
from drafterkit.train.recipe import recipe_from_dict
from drafterkit.train.strategies import get_strategy


def _drafter(target, n=48, seed=0, noise=0.3, **kw):
    torch.manual_seed(seed)
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=n, **kw), target=target)
    d.set_draft_vocab(torch.randperm(target.config.vocab_size)[:n], target=target)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith(d.borrowed_prefixes):
                p.add_(torch.randn(p.shape) * noise)
    return d.eval()


def test_ttt_mask_matches_a_hand_built_one():
    x, o = True, False
    want = torch.tensor([
        # step-0 keys     step-1 keys     step-2 keys
        [x, o, o,         x, o, o,        x, o, o],
        [x, x, o,         o, x, o,        o, x, o],
        [x, x, x,         o, o, x,        o, o, x],
    ])
    assert torch.equal(ttt_attention_mask(3, 2), want)
    assert torch.equal(ttt_attention_mask(3, 0), want[:, :3])
    with pytest.raises(ValueError):
        ttt_attention_mask(3, -1)


def test_d2t_t2d_are_consistent():
    counts = torch.zeros(200, dtype=torch.long)
    hot = torch.tensor([199, 150, 3, 77, 120, 181, 64, 10])
    counts[hot] = torch.arange(100, 100 + len(hot))
    counts[5] = 1  # rare
    ids = select_draft_vocab(counts, 8)
    d2t, t2d = mapping_from_ids(ids, 200)
    assert int(t2d.sum()) == 8
    mapped = torch.arange(8) + d2t
    assert mapped.unique().numel() == 8 and mapped.min() >= 0 and mapped.max() < 200
    assert set(mapped.tolist()) == set(hot.tolist())
    assert torch.equal(t2d.nonzero().flatten(), mapped.sort().values)
    with pytest.raises(ValueError):
        mapping_from_ids(torch.tensor([1, 1, 2]), 200)


def test_default_feature_layers_follow_eagle3_and_stay_below_the_layer_count():
    assert default_feature_layers(30) == (2, 15, 27)
    assert default_feature_layers(2) == (1, 1, 1)
    assert default_feature_layers(1) == (0, 0, 0)
    for n in range(1, 40):
        ids = default_feature_layers(n)
        check_feature_layers(ids, n)  # the default is valid for its own target
        assert all(0 <= i < n for i in ids) and list(ids) == sorted(ids)
    # from 3 layers on, three distinct ids (an engine captures each layer once): (2, 2, 1) was the default for 4,
    # (2, 1, 1) for 3 (repeated and out of order)
    assert [default_feature_layers(n) for n in (3, 4, 5, 6, 7)] == [(0, 1, 2), (1, 2, 3), (1, 2, 4), (1, 3, 5),
                                                                   (2, 3, 4)]
    assert all(len(set(default_feature_layers(n))) == 3 for n in range(3, 40))


@pytest.mark.parametrize("layers", range(1, 8))
def test_the_feature_layers_error_is_true_for_small_targets(layers):
    """The refusal of an id past the target states the valid range and this target's default, and what it states
    holds: the default it names is default_feature_layers(L), valid for check_feature_layers, and the formula
    (2, L//2, L-3) is written as that default only where it gives it (it once read "(2, L//2, L-3) = [1, 1, 1]"
    for 2 layers and "(2, L//2, L-3) = [1, 2, 3]" for 4)."""
    with pytest.raises(ValueError) as info:
        check_feature_layers([0, 0, layers], layers)
    message = str(info.value)
    span = "3 ids, all 0" if layers == 1 else f"3 ids in [0, {layers - 1}]"
    assert span in message and f"for a {layers}-layer target" in message
    default = list(default_feature_layers(layers))
    named = re.search(r"the default for this target is (?:\(2, L//2, L-3\) = )?(\[[\d, ]+\])", message)
    assert named and json.loads(named.group(1)) == default
    check_feature_layers(default, layers)
    formula = [2, layers // 2, layers - 3]
    assert ("(2, L//2, L-3) = " in message) == (formula == default)
    for claim in re.findall(r"\((\d+), L//2, L-(\d+)\)", message):  # "(1, L//2, L-1)" must give the default
        if f"({claim[0]}, L//2, L-{claim[1]}): EAGLE-3's" in message:
            assert [int(claim[0]), layers // 2, layers - int(claim[1])] == default
    assert ("no serving engine can take it" in message) == (len(set(default)) < 3)


def test_the_train_cli_refuses_feature_layers_past_a_3_layer_target(tmp_path, capsys):
    """Through `drafterkit train`: a recipe with feature_layers [1, 2, 3] for a 3-layer target is refused when the
    recipe is validated (the recipe's error, one line naming the option, the valid ids and the default (0, 1, 2))."""
    from families import save_family

    from drafterkit.cli import main as cli

    save_family("llama3", tmp_path / "target3", num_hidden_layers=3)
    capsys.readouterr()  # the save's progress bars
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'run'}\ntarget: {{name_or_path: {tmp_path / 'target3'}}}\n"
                      "drafter: {kind: eagle3, options: {draft_vocab_size: 64, feature_layers: [1, 2, 3]}}\n")
    assert cli(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("drafter.options.feature_layers: EAGLE-3 feature layers [1, 2, 3]"), err
    assert "3 ids in [0, 2]" in line and "the default for this target is [0, 1, 2]" in line
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()


def test_a_feature_layer_id_equal_to_the_layer_count_is_refused(tmp_path):
    """Id L is the output after the final norm, which serving engines cannot read: a new head with it is
    refused, and so is an old checkpoint whose config holds it (retrain), naming the convention."""
    from drafterkit.drafters import DrafterLoadError, load_drafter

    target = tiny_llama(0, layers=4)
    with pytest.raises(ValueError, match=r"id 4 is the last layer's output after the final norm.*retrain"):
        Eagle3Config.from_target(target, draft_vocab_size=32, feature_layers=[1, 2, 4])
    with pytest.raises(ValueError, match=r"input of decoder layer i"):
        Eagle3Config.from_target(target, draft_vocab_size=32, feature_layers=[1, 2, 5])
    assert Eagle3Config.from_target(target, draft_vocab_size=32, feature_layers=[0, 2, 3]).feature_layers == [0, 2, 3]
    d = _drafter(target, n=32)
    d.save_pretrained(tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    cfg["config"]["feature_layers"] = [1, 2, 4]  # as a checkpoint saved before the ids were checked
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=r"config.json: EAGLE-3 feature layers \[1, 2, 4\].*retrain"):
        load_drafter(tmp_path / "old", target=target)


@pytest.mark.parametrize("layers", [1, 2])
def test_ttt_unroll_equals_decoding_on_the_same_tokens(layers):
    """Step j of the TTT forward at the end of the real prefix must reproduce draft token j+1 (every step, with
    one decoder layer and with a stack of two: each step's queries attend every layer's cache of the prefix)."""
    target = tiny_llama(0, layers=4)
    d = _drafter(target, num_layers=layers)
    tokens = [5, 17, 33, 2, 90, 41, 41, 7]
    n, k = len(tokens), 4
    with torch.no_grad():
        hs = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i][0] for i in d.feature_layers], -1)  # [n, 3H]
    st = DecodeState(tokens=[tokens], num_stable=[0], features=[feats[: n - 1]], active=[True], vocab_size=128)
    d.reset(1)
    drafts = d.propose(st, k, SamplingParams(), None).tokens[0].tolist()
    ids = torch.tensor([tokens + drafts[:-1]])  # teacher-forced on the draft tokens
    f = torch.cat([feats, torch.randn(k - 1, feats.shape[1])])[None]  # junk features past the prefix
    with torch.no_grad():
        outs = d(ids, f, steps=k)
    got = [int(d.draft_ids()[outs[j][0, n - 2].argmax()]) for j in range(k)]
    assert got == drafts


def test_sampled_q_is_scattered_onto_the_target_vocabulary():
    target = tiny_llama(0)
    d = _drafter(target, n=40)
    tokens = [4, 5, 6, 7, 8]
    with torch.no_grad():
        hs = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i][0] for i in d.feature_layers], -1)
    st = DecodeState(tokens=[tokens], num_stable=[0], features=[feats], active=[True], vocab_size=128)
    d.reset(1)
    prop = d.propose(st, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert prop.probs.shape == (1, 3, 128)
    outside = ~d.t2d
    assert (prop.probs[..., outside] == 0).all()
    assert torch.allclose(prop.probs.sum(-1), torch.ones(1, 3), atol=1e-5)
    assert d.t2d[prop.tokens].all()


def _train(target, batch, vocab, steps):
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": "eagle3", "options": {"draft_vocab_size": 32, "ttt_steps": 2}}})
    torch.manual_seed(0)
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=32, ttt_steps=2), target=target)
    d.set_draft_vocab(vocab, target=target)
    d.train()
    opt = torch.optim.Adam([p for n, p in d.named_parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss, _ = get_strategy("eagle3").loss(d, target, batch, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return d.eval()


def test_frequency_mapping_beats_identity_when_frequent_tokens_have_high_ids():
    target = tiny_llama(0)
    with torch.no_grad():
        target.lm_head.weight[:96] = 0.0  # the target's greedy choices all lie in ids 96..127
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 128, (4,), generator=g).tolist() for _ in range(24)]
    res = engine.generate(target, prompts, max_new_tokens=20)
    ids = torch.tensor([p + s for p, s in zip(prompts, res.sequences)])
    lm = torch.zeros_like(ids)
    lm[:, 4:] = 1
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": lm}
    counts = torch.bincount(ids[lm.bool()], minlength=128)
    mapped = select_draft_vocab(counts, 32)
    assert (mapped >= 96).sum() >= 20  # the data's frequent tokens are mostly high ids
    rates = {}
    for name, vocab in (("mapped", mapped), ("identity", torch.arange(32))):
        d = _train(target, batch, vocab, steps=40)
        r = engine.generate(target, prompts[:8], drafter=d, max_new_tokens=16, num_draft_tokens=3)
        rates[name] = r.stats.acceptance_rate
    assert rates["mapped"] > 0.3 and rates["mapped"] > rates["identity"] + 0.25, rates


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_a_head_for_another_target_is_refused_before_generating(kind):
    from drafterkit.drafters import get_kind

    trained_for = tiny_llama(0, layers=4)
    other = tiny_llama(0, layers=2)
    cls = get_kind(kind)
    cfg = cls.config_class.from_target(trained_for, **({"draft_vocab_size": 32} if kind == "eagle3" else {}))
    d = cls(cfg, target=trained_for)
    with pytest.raises(ValueError, match="train the drafter for this target"):
        engine.generate(other, [[1, 2, 3]], drafter=d, max_new_tokens=4, num_draft_tokens=2)


def test_last_feature_fc_init_passes_the_top_feature_layer_through():
    from drafterkit.train.strategies.eagle3 import init_fc_last_feature

    target = tiny_llama(0, layers=4)
    d = _drafter(target)
    init_fc_last_feature(d)
    h = target.config.hidden_size
    feats = torch.randn(2, 5, 3 * h)
    assert torch.allclose(d.fc(feats), feats[..., 2 * h:])


def test_split_attention_init_sees_embedding_plus_hidden_as_the_target_layer_would():
    """Both halves of the head's 2H-wide q/k/v get the target's last-layer weights: the projection of
    [e; x] equals the target's projection of e + x; the two input norms start as the target's."""
    from drafterkit.drafters.heads.feature_head import init_layer_from_target
    from drafterkit.train.strategies.eagle3 import init_split_attention_from_target

    target = tiny_llama(0, layers=4)
    d = _drafter(target)
    init_layer_from_target(d.layer, target)  # as Eagle3Strategy.build does first
    init_split_attention_from_target(d.layer, target)
    src = target.model.layers[-1]
    e, x = torch.randn(3, target.config.hidden_size), torch.randn(3, target.config.hidden_size)
    for name in ("q_proj", "k_proj", "v_proj"):
        mine, theirs = getattr(d.layer.self_attn, name), getattr(src.self_attn, name)
        assert torch.allclose(mine(torch.cat([e, x], -1)), theirs(e + x), atol=1e-5)
    assert torch.equal(d.layer.input_layernorm.weight, src.input_layernorm.weight)
    assert torch.equal(d.layer.hidden_norm.weight, src.input_layernorm.weight)


def test_layers_after_the_first_start_as_the_identity_on_the_residual_stream():
    """init_stacked_layer_from_target: a 2-layer head whose layer 0 and fc equal a 1-layer head's outputs the same
    hidden states and logits at start (zeroed o_proj / down_proj), and its second layer holds the target's
    last-layer q/k/v and input norm (a plain Llama layer: H-wide q/k/v)."""
    from drafterkit.train.strategies.eagle3 import init_stacked_layer_from_target

    target = tiny_llama(0, layers=4)
    one, two = _drafter(target, seed=1), _drafter(target, seed=2, num_layers=2)
    two.load_state_dict(one.state_dict(), strict=False)  # the same fc, layer 0, norm, LM head
    init_stacked_layer_from_target(two.layers["1"], target)
    src = target.model.layers[-1]
    assert torch.equal(two.layers["1"].self_attn.q_proj.weight, src.self_attn.q_proj.weight)
    assert torch.equal(two.layers["1"].input_layernorm.weight, src.input_layernorm.weight)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    feats = torch.randn(1, 6, 3 * target.config.hidden_size)
    with torch.no_grad():
        for a, b in zip(one(ids, feats, steps=3), two(ids, feats, steps=3)):
            torch.testing.assert_close(a, b)


def test_the_layer_count_is_recorded_and_a_checkpoint_saved_without_it_loads_as_one_layer(tmp_path):
    from drafterkit.drafters import load_drafter

    target = tiny_llama(0, layers=4)
    two = _drafter(target, num_layers=2)
    back = load_drafter(two.save_pretrained(tmp_path / "two"), target=target)
    assert json.loads((tmp_path / "two" / "config.json").read_text())["config"]["num_layers"] == 2
    assert back.config.num_layers == 2 and len(back.draft_layers()) == 2
    assert all(torch.equal(v, back.own_state_dict()[k]) for k, v in two.own_state_dict().items())
    one = _drafter(target)
    one.save_pretrained(tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    del cfg["config"]["num_layers"]  # as saved before the head had a layer count
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    old = load_drafter(tmp_path / "old", target=target)
    assert old.config.num_layers == 1 and not any(k.startswith("layers.") for k in old.own_state_dict())
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="num_layers .* must be an integer >= 1"):
            Eagle3Config.from_target(target, draft_vocab_size=32, num_layers=bad)
