"""P-EAGLE (drafters/peagle.py): one head pass drafts K tokens; exact greedy (chain, static and dynamic trees) and
sampling; the training pass is the decoder's pass; mask inputs only where the token is not known; export."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import engine, generate
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import load_drafter
from drafterkit.drafters.export.eagle3_layout import load_peagle_export
from drafterkit.drafters.export.writers import export
from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter

V = 16


LAYERS = pytest.mark.parametrize("layers", [1, 2])  # the head's decoder layers (drafter.options.num_layers)


def _peagle(target, n_vocab: int = 48, mask_token_id: int = 3, seed: int = 0, layers: int = 1) -> PEagleDrafter:
    d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=n_vocab, mask_token_id=mask_token_id,
                                               num_layers=layers), target=target)
    vocab = target.config.vocab_size
    d.set_draft_vocab(torch.arange(n_vocab) * (vocab // n_vocab), target=target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in d.own_state_dict().items():
            if t.is_floating_point():
                dict(d.named_parameters())[name].add_(torch.randn(t.shape, generator=g) * 0.05)
    return d.eval()


def _state(target, rows, layers, stable=None):
    feats = []
    for r in rows:
        out = target(torch.tensor([r[:-1]]), output_hidden_states=True)
        feats.append(torch.cat([out.hidden_states[i][0] for i in layers], -1))
    return DecodeState(tokens=[list(r) for r in rows], num_stable=stable or [0] * len(rows), features=feats,
                       active=[True] * len(rows), vocab_size=target.config.vocab_size)


@LAYERS
@pytest.mark.parametrize("tree", [None, "3,2,1", "dynamic:8:3:2"])
def test_greedy_output_equals_plain_greedy_chain_and_trees(tree, layers):
    target = tiny_llama(0)
    d = _peagle(target, layers=layers)
    prompts = [[5, 6, 7, 8, 9, 5, 6], [20, 21], [1, 2, 3, 4]]
    plain = engine.generate(target, prompts, max_new_tokens=16)
    spec = engine.generate(target, prompts, drafter=d, max_new_tokens=16, num_draft_tokens=4, tree=tree)
    assert spec.sequences == plain.sequences
    assert spec.stats.drafted > 0


def test_tree_nodes_take_each_positions_top_k():
    """The static tree from one pass: the rank-0 path is the greedy chain, and every node at a depth with the
    same rank holds the same token whatever its parent (the positions do not read their ancestors' tokens)."""
    from drafterkit.decode.tree import DraftTree

    target = tiny_llama(0)
    d = _peagle(target)
    st = _state(target, [[5, 6, 7, 8, 9]], d.feature_layers)
    tree = DraftTree.from_widths([2, 2])
    prop = d.propose_tree(st, tree, SamplingParams(), None)
    chain = d.propose(_state(target, [[5, 6, 7, 8, 9]], d.feature_layers), 2, SamplingParams(), None)
    d.reset(1)
    # rank-0 nodes at depth 1 and 2 are the chain's tokens; the rank-1 node at depth 2 repeats under both parents
    first = [i for i, (dd, r) in enumerate(zip(tree.depths, tree.ranks)) if dd == 1 and r == 0][0]
    second = [i for i, (dd, r, p) in enumerate(zip(tree.depths, tree.ranks, tree.parents))
              if dd == 2 and r == 0 and p == first][0]
    assert prop.tokens[0, first] == chain.tokens[0, 0] and prop.tokens[0, second] == chain.tokens[0, 1]
    same_depth = [prop.tokens[0, i] for i, (dd, r) in enumerate(zip(tree.depths, tree.ranks)) if dd == 2 and r == 1]
    assert len({int(t) for t in same_depth}) == 1


@LAYERS
def test_sampled_tokens_follow_the_target_distribution_with_two_parallel_positions(layers):
    """Temperature 1, chains of 2 drafted in one pass (max_new_tokens 4): the first three tokens' joint law is
    the target's (chi-square), with a reduced draft vocabulary (q is 0 on target ids outside it)."""
    from scipy import stats  # noqa: F401 (the chi-square helpers need scipy)
    from test_decode_distribution import _chi2, _exact_joint

    target = tiny_llama(0, vocab_size=V)
    d = _peagle(target, n_vocab=12, mask_token_id=5, layers=layers)
    params, runs, prompt = SamplingParams(1.0), 3000, [1, 5, 9]
    res = generate(target, [prompt] * runs, drafter=d, max_new_tokens=4, num_draft_tokens=2, temperature=1.0,
                   seed=1234, eos_token_id=[])
    seqs = torch.tensor(res.sequences)  # [runs, 4]
    joint = _exact_joint(target, params, prompt)  # [V, V, V]
    c12 = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    c23 = torch.bincount(seqs[:, 1] * V + seqs[:, 2], minlength=V * V).double()
    assert _chi2(c12, joint.sum(2).flatten()) > 1e-3
    assert _chi2(c23, joint.sum(0).flatten()) > 1e-3
    assert _chi2(torch.bincount(seqs[:, 2], minlength=V).double(), joint.sum((0, 1))) > 1e-3
    assert res.stats.drafted >= 2 * runs and res.stats.accept_per_position[1] > 0  # position 2 was verified


@LAYERS
def test_training_pass_is_the_decoders_pass(layers):
    """The chain started at t in the training pass (depth 0 at t, masked depths 1..K-1) gives the same head
    outputs as the decoder's one pass after the prefix tokens[0..t+1], to 1e-5, at every depth and with a
    stack of layers (each masked query attends every layer's keys of the real prefix and of its own chain)."""
    target = tiny_llama(0)
    d = _peagle(target, layers=layers)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]])
    out = target(ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in d.feature_layers], -1)
    k = 4
    for t in (0, 3, 6):
        anchors = torch.tensor([[t] * (k - 1) + [-1]])
        depths = torch.tensor([list(range(1, k)) + [1]])
        with torch.no_grad():
            out0, out_m = d(ids, feats, anchors, depths)
        train = torch.cat([out0[0, t:t + 1], out_m[0, :k - 1]])  # [k, H]
        d.reset(1)
        st = DecodeState(tokens=[ids[0, :t + 2].tolist()], num_stable=[0], features=[feats[0, :t + 1]],
                         active=[True], vocab_size=target.config.vocab_size)
        with torch.no_grad():
            dec = d._outputs([0], st, k)[0]
        torch.testing.assert_close(train, dec, atol=1e-5, rtol=1e-5)


@LAYERS
def test_mask_inputs_are_never_fed_where_a_real_token_is_known(monkeypatch, layers):
    """Every layer call, in decoding (several rounds, rows re-synced with num_stable) and in training: a
    position whose token is known gets that token and the target's fused feature; mask inputs
    (mask_token_id, fc(mask_hidden)) only at positions past the last committed token."""
    target = tiny_llama(0)
    # 7 also occurs in the prompt: ids alone cannot tell the inputs apart
    d = _peagle(target, mask_token_id=7, layers=layers)
    calls = []
    original = PEagleDrafter._layer

    def spy(self, ids, hidden, positions, mask, past):
        calls.append((ids.clone(), hidden.detach().clone(), positions.clone()))
        return original(self, ids, hidden, positions, mask, past)

    monkeypatch.setattr(PEagleDrafter, "_layer", spy)
    prompt = [5, 6, 7, 8, 9, 7, 6]
    res = engine.generate(target, [prompt], drafter=d, max_new_tokens=12, num_draft_tokens=3)
    tokens = prompt + res.sequences[0]
    with torch.no_grad():
        out = target(torch.tensor([tokens]), output_hidden_states=True)
        fc_real = d.fc(torch.cat([out.hidden_states[i][0] for i in d.feature_layers], -1))  # [T, H]
        fc_mask = d.mask_inputs((1,), fc_real.dtype)[1][0]
    assert len(calls) >= 3 and sum(1 for _, h, _ in calls if torch.allclose(h[0, -1], fc_mask)) >= 2
    for ids, hidden, positions in calls:
        pos = positions[0].tolist()
        real = [i for i, p in enumerate(pos) if not torch.allclose(hidden[0, i], fc_mask, atol=1e-6)]
        masked = [i for i in range(len(pos)) if i not in real]
        assert masked == list(range(real[-1] + 1 if real else 0, len(pos)))  # masks come last (none for k = 1)
        for i in real:  # a known position: the committed token t+1 and the target's feature at t
            assert ids[0, i] == tokens[pos[i] + 1]
            torch.testing.assert_close(hidden[0, i], fc_real[pos[i]], atol=1e-4, rtol=1e-4)
        assert all(ids[0, i] == 7 for i in masked)
        if real and masked:  # the first masked position is right after the last real one: its token is unknown
            assert pos[masked[0]] == pos[real[-1]] + 1
    calls.clear()
    ids = torch.tensor([tokens])
    feats = torch.cat([out.hidden_states[i] for i in d.feature_layers], -1)
    d(ids, feats, torch.tensor([[2, 2, 5]]), torch.tensor([[1, 2, 1]]))
    (i0, h0, _), (im, hm, pm) = calls
    assert torch.equal(i0[0, :-1], ids[0, 1:]) and torch.allclose(h0[0], fc_real, atol=1e-4)
    assert (im == 7).all() and torch.allclose(hm[0], fc_mask.expand(3, -1)) and pm[0].tolist() == [3, 4, 6]


def test_config_and_checkpoint(tmp_path):
    target = tiny_llama(0)
    with pytest.raises(ValueError, match="mask_token_id must be a target token id"):
        PEagleConfig.from_target(target, draft_vocab_size=48, mask_token_id=10 ** 6)
    d = _peagle(target)
    assert d.own_state_dict()["mask_hidden"].shape == (3 * target.config.hidden_size,)
    back = load_drafter(d.save_pretrained(tmp_path / "p"), target=target)
    assert type(back) is PEagleDrafter and torch.equal(back.mask_hidden, d.mask_hidden)
    assert back.config.mask_token_id == 3


def test_vllm_peagle_export_holds_what_vllms_parallel_drafting_loads(tmp_path):
    """vLLM 0.32's Eagle3LlamaForCausalLM with parallel_drafting needs `mask_hidden` among the weights and a
    `mask_token_id` / `pard_token` in config.json; the export loads back into the same proposals."""
    target = tiny_llama(0, layers=4)
    d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3],
                                               mask_token_id=9), target=target)
    d.set_draft_vocab(torch.arange(40) * 3, target=target)
    ckpt = d.save_pretrained(tmp_path / "p")
    out = export(ckpt, "vllm-peagle", tmp_path / "export")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["mask_token_id"] == cfg["pard_token"] == 9
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    from safetensors.torch import load_file

    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["mask_hidden"].shape == (3 * target.config.hidden_size,) and "d2t" in tensors
    assert "midlayer.self_attn.q_proj.weight" in tensors and not any(k.startswith("embed") for k in tensors)
    card = (out / "README.md").read_text()  # the model card serves it with vLLM's parallel drafting
    assert '"method": "eagle3"' in card and '"parallel_drafting": true' in card and "P-EAGLE head" in card
    back = load_peagle_export(out, target)
    st = _state(target, [[5, 6, 7, 8]], d.feature_layers)
    d.reset(1)
    a = d.propose(st, 3, SamplingParams(), None).tokens
    b = back.propose(_state(target, [[5, 6, 7, 8]], d.feature_layers), 3, SamplingParams(), None).tokens
    assert torch.equal(a, b)
    with pytest.raises(Exception, match="format 'vllm-peagle' exports 'peagle' drafters"):
        from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter

        e3 = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]),
                           target=target)
        export(e3.save_pretrained(tmp_path / "e3"), "vllm-peagle", tmp_path / "x")


def test_side_by_side_overrides_the_peagle_training_only(tmp_path):
    """benchmarks/peagle_side_by_side.py: --peagle-override (e.g. the layer count) reaches the P-EAGLE training
    command only, --override both; the EAGLE-3 head it is measured against keeps its recipe."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    before = list(sys.path)
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import peagle_side_by_side as sbs
    finally:
        sys.path[:] = before
    args = sbs.parser().parse_args(["--out", str(tmp_path), "--steps", "2", "--override", "optim.lr=1e-3",
                                    "--peagle-override", "drafter.options.num_layers=2"])
    pe, e3 = sbs.train_command("peagle", tmp_path / "peagle", args), sbs.train_command("eagle3", tmp_path / "e3", args)
    assert "drafter.options.num_layers=2" in pe and "drafter.options.num_layers=2" not in e3
    assert "optim.lr=1e-3" in pe and "optim.lr=1e-3" in e3 and "train.max_steps=2" in e3
