"""One conformance suite for every drafter kind: strict save/load, valid proposals, greedy equivalence."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from safetensors.torch import load_file, save_file

from drafterkit.decode import exact_mode
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import KINDS, DrafterLoadError, get_kind, load_drafter


def test_every_registered_kind_imports_and_matches_its_entry():
    """Each drafters.kinds.KINDS entry names classes that exist in drafters/<kind>.py and agree with it (a kind
    whose module fails to import fails here, and in every parametrized test below: nothing is skipped)."""
    from drafterkit.drafters.export.writers import FORMATS

    for name, entry in KINDS.items():
        cls = entry.drafter_class()
        assert cls.kind == name and cls.__module__ == f"drafterkit.drafters.{name}"
        assert cls.config_class is entry.config_class()
        assert all(FORMATS[fmt] == name for fmt in entry.exports)
        # `trees` says what the class can draft: eval, tune and quickstart refuse tree shapes from it alone
        assert entry.trees == callable(getattr(cls, "propose_tree", None)), name
        assert entry.trees == callable(getattr(cls, "propose_dynamic_tree", None)), name
    assert sorted(FORMATS) == sorted(f for e in KINDS.values() for f in e.exports)


def test_a_kind_whose_module_is_missing_fails_loudly():
    from drafterkit.drafters.kinds import Kind

    with pytest.raises(ModuleNotFoundError):
        Kind("no_such_kind", "NoDrafter", "NoConfig").drafter_class()
    with pytest.raises(ValueError, match="no conformance build"):
        build("no_such_kind", None)


def _perturb(drafter, seed: int = 0) -> None:
    """Random non-zero values in every own floating tensor (zero-init heads would hide load bugs)."""
    g = torch.Generator().manual_seed(seed)
    own = drafter.own_state_dict().keys()
    with torch.no_grad():
        for name, t in drafter.state_dict(keep_vars=True).items():
            if name in own and t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g) * 0.05)


def build(kind: str, target):
    if kind == "draft_lm":
        from drafterkit.drafters.draft_lm import DraftLM
        return DraftLM.from_target(target, 1)
    if kind in ("ngram", "suffix"):  # model-free: nothing to build from the target
        return get_kind(kind)()
    if kind == "medusa":
        from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
        d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    elif kind == "eagle":
        from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
        d = EagleDrafter(EagleConfig.from_target(target), target=target)
    elif kind == "dflash":
        from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
        d = DFlashDrafter(DFlashConfig.from_target(target, num_layers=2, block_size=4), target=target)
    elif kind == "dflash_reduced":  # a reduced draft vocabulary (own LM head, d2t / t2d)
        from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
        d = DFlashDrafter(DFlashConfig.from_target(target, block_size=4, draft_vocab_size=48), target=target)
        d.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    elif kind == "dspark":
        from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
        d = DSparkDrafter(DSparkConfig.from_target(target, num_layers=2, block_size=4, markov_rank=8), target=target)
    elif kind == "dspark_reduced":  # reduced vocabulary: the Markov bias over draft ids, its input a target id
        from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
        d = DSparkDrafter(DSparkConfig.from_target(target, block_size=4, draft_vocab_size=48, markov_rank=8),
                          target=target)
        d.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    elif kind in ("peagle", "peagle_2layers"):
        from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter
        d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=48, mask_token_id=3,
                                                   num_layers=1 + kind.endswith("s")), target=target)
        d.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    elif kind in ("eagle3", "eagle3_2layers"):  # EAGLE-3's one layer, and a stack of two (num_layers)
        from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
        d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=48, num_layers=1 + kind.endswith("s")),
                          target=target)
        d.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    else:  # a kind added to drafters.kinds.KINDS needs its small build here
        raise ValueError(f"no conformance build for drafter kind {kind!r}: add one to "
                         "tests/test_drafters_conformance.py")
    _perturb(d)
    return d.eval()


# besides the registered kinds: DFlash with a reduced vocabulary, EAGLE-3 / P-EAGLE with a stack of two layers
KIND_PARAMS = [pytest.param(k) for k in sorted(KINDS)] + [
    pytest.param(k) for k in ("dflash_reduced", "dspark_reduced", "eagle3_2layers", "peagle_2layers")]


def _state(target, rows, layers):
    feats = None
    if layers is not None:
        feats = []
        for r in rows:
            out = target(torch.tensor([r[:-1]]), output_hidden_states=True)
            feats.append(torch.cat([out.hidden_states[i][0] for i in layers], -1))
    return DecodeState(tokens=[list(r) for r in rows], num_stable=[0] * len(rows), features=feats,
                       active=[True] * len(rows), vocab_size=target.config.vocab_size)


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_save_load_round_trip_is_bit_exact(kind, tmp_path):
    target = tiny_llama(0)
    d = build(kind, target)
    d.save_pretrained(tmp_path / "ckpt")
    back = load_drafter(tmp_path / "ckpt", target=target)
    assert type(back) is type(d)
    a, b = d.own_state_dict(), back.own_state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    rows = [[5, 6, 7, 8, 9, 5, 6], [11, 12, 13]]
    for dr in (d, back):
        dr.reset(len(rows))
    st = _state(target, rows, d.feature_layers)
    k = 3
    p1 = d.propose(st, k, SamplingParams(), None).tokens
    p2 = back.propose(_state(target, rows, d.feature_layers), k, SamplingParams(), None).tokens
    assert torch.equal(torch.as_tensor(p1), torch.as_tensor(p2))


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_loading_is_strict(kind, tmp_path):
    target = tiny_llama(0)
    d = build(kind, target)
    path = d.save_pretrained(tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    # an unexpected tensor is an error
    save_file({**state, "surprise.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="unexpected"):
        load_drafter(path, target=target)
    if not state:
        return  # a tensor-free drafter (n-gram) has nothing that could go missing
    missing = dict(state)
    missing.pop(min(missing))
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="missing"):
        load_drafter(path, target=target)


#: Per kind, a config.json edit that changes the shapes of the drafter's own tensors.
_RESHAPE = {"draft_lm": lambda c: c["hf_config"].update(intermediate_size=40),
            "medusa": lambda c: c.update(num_heads=2),
            "eagle": lambda c: c.update(intermediate_size=40), "eagle3": lambda c: c.update(draft_vocab_size=40),
            "dflash": lambda c: c.update(num_layers=1), "peagle": lambda c: c.update(draft_vocab_size=40),
            "dflash_reduced": lambda c: c.update(draft_vocab_size=40), "dspark": lambda c: c.update(markov_rank=4)}


@pytest.mark.parametrize("kind", sorted(_RESHAPE))
def test_a_config_json_that_disagrees_with_its_weights_is_named_before_the_target_is_blamed(kind, tmp_path, capsys):
    """config.json from another save (or edited): loading and export name both files and the first tensor
    that differs, reading the weights file's header only, instead of a shape error blamed on the target or
    an export that the serving engine then refuses."""
    import json

    from drafterkit.cli import main as cli
    from drafterkit.drafters.base import Drafter

    target = tiny_llama(0, layers=8)  # EAGLE-3's default ids (2, 4, 5), which engines express ((1, 1, 1) on 2 layers)
    path = build(kind, target).save_pretrained(tmp_path / "ckpt")
    data = json.loads((path / "config.json").read_text())
    _RESHAPE[kind](data["config"])
    (path / "config.json").write_text(json.dumps(data))
    kind_cls = get_kind(data["kind"])
    assert issubclass(kind_cls, Drafter)
    with pytest.raises(DrafterLoadError, match=r"model.safetensors does not match .*config.json: (tensor|missing)"):
        kind_cls.check_weights(path)
    with pytest.raises(DrafterLoadError, match="come from different saves"):
        load_drafter(path, target=target)
    fmt = {"draft_lm": "hf-assistant", "medusa": "medusa", "eagle3": "vllm-eagle3",
           "peagle": "vllm-peagle", "dspark": "vllm-dspark"}.get(kind, "vllm-dflash")
    if kind == "eagle":
        return  # no export format takes EAGLE-1
    assert cli(["export", str(path), "--format", fmt, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "come from different saves" in err and not (tmp_path / "out").exists()


def test_a_damaged_config_json_is_named_as_such(tmp_path):
    """A config.json cut short or holding a JSON list: one error saying which, never a JSON traceback."""
    target = tiny_llama(0)
    path = build("eagle", target).save_pretrained(tmp_path / "ckpt")
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(DrafterLoadError, match="config.json is not valid JSON.*a damaged or half-written file"):
        load_drafter(path, target=target)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(DrafterLoadError, match="config.json is JSON but not an object"):
        load_drafter(path, target=target)


@pytest.mark.parametrize("kind", KIND_PARAMS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_proposals_are_valid_ids(kind, temperature):
    target = tiny_llama(0)
    d = build(kind, target)
    rows = [[3, 4, 5, 3, 4], [100, 101, 127, 9]]
    d.reset(len(rows))
    st = _state(target, rows, d.feature_layers)
    gen = torch.Generator().manual_seed(0)
    prop = d.propose(st, 3, SamplingParams(temperature=temperature), gen)
    toks = torch.as_tensor(prop.tokens)
    assert toks.shape == (2, 3) and toks.dtype == torch.long
    assert ((toks >= 0) & (toks < st.vocab_size)).all()
    if prop.probs is not None:
        p = prop.probs
        assert p.shape[:2] == (2, 3) and p.shape[2] >= st.vocab_size
        assert torch.allclose(p.sum(-1), torch.ones(2, 3), atol=1e-5)
        assert (p.gather(-1, toks[..., None]) > 0).all()  # each token was drawn from its q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_greedy_generate_equals_plain_greedy(kind, dtype):
    from drafterkit.decode import engine

    target = tiny_llama(0).to(dtype)
    d = build(kind, target).to(dtype)
    prompts = [[5, 6, 7, 8, 9, 5, 6], [20, 21], [1, 2, 3, 4]]
    with exact_mode(dtype != torch.float32):  # bf16: the bitwise-exact mode; fp32: exact on the default path
        plain = engine.generate(target, prompts, max_new_tokens=24)
        spec = engine.generate(target, prompts, drafter=d, max_new_tokens=24, num_draft_tokens=3)
    assert spec.sequences == plain.sequences
    assert spec.stats.drafted > 0


TRAINED_KINDS = [k for k in KIND_PARAMS if k.values[0] not in KINDS or KINDS[k.values[0]].trainable]


@pytest.mark.parametrize("kind", TRAINED_KINDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_threshold_shortens_chains_and_keeps_output(kind, temperature):
    """``draft_threshold`` (ChainCutoff): fewer draft tokens, the same greedy output; near 1 (a tiny random
    drafter is never that sure) nothing is drafted at all (every round is a plain step)."""
    from drafterkit.decode import engine

    target = tiny_llama(0)
    d = build(kind, target)
    prompts = [[5, 6, 7, 8, 9, 5, 6], [20, 21], [1, 2, 3, 4]]
    kw = dict(max_new_tokens=24, temperature=temperature, seed=3)
    plain = engine.generate(target, prompts, **kw)
    runs = {}
    for thr in (0.0, 0.02, 0.9999):
        d.draft_threshold = thr
        runs[thr] = engine.generate(target, prompts, drafter=d, num_draft_tokens=3, **kw)
        assert all(len(s) == 24 or r == "stop" for s, r in zip(runs[thr].sequences, runs[thr].finish_reasons))
        if temperature == 0.0:
            assert runs[thr].sequences == plain.sequences, thr
    assert runs[0.9999].stats.drafted == 0 and runs[0.9999].stats.accepted == 0
    assert runs[0.9999].stats.tau == 1.0
    assert 0 < runs[0.02].stats.drafted, "a tiny threshold should still draft"
    per_round = {t: r.stats.drafted / max(r.stats.target_forwards, 1) for t, r in runs.items()}
    assert per_round[0.02] < per_round[0.0], per_round


def test_chain_cutoff_by_path_probability():
    from drafterkit.decode.cutoff import ChainCutoff

    cut = ChainCutoff(0.44, batch_size=2, k=3)
    probs = [torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([[0.5, 0.5], [0.9, 0.1]]),
             torch.tensor([[0.9, 0.1], [0.9, 0.1]])]
    for j, p in enumerate(probs):
        cut.update(j, torch.tensor([0, 0]), probs=p)  # row 0: 0.9, 0.45, 0.405; row 1: 0.3 (cut at 0)
    assert cut.lengths.tolist() == [2, 0] and cut.done
    assert ChainCutoff(0.0, 2, 3).lengths is None  # off: the proposer's full k
    logits = torch.tensor([[2.0, 0.0]])
    one = ChainCutoff(0.8, 1, 2)
    one.update(0, torch.tensor([0]), logits=logits)  # softmax(2, 0)[0] = 0.881
    assert not one.done
    one.update(1, torch.tensor([1]), logits=logits)  # 0.881 * 0.119 < 0.8
    assert one.done and one.lengths.tolist() == [1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "peagle"])
def test_real_target_greedy_equivalence(kind, real_target):
    """Untrained heads on SmolLM2-135M: speculative greedy output equals plain greedy output."""
    from drafterkit.decode import engine

    target, tok = real_target
    torch.manual_seed(0)
    if kind == "medusa":
        from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
        d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    elif kind == "eagle":
        from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
        d = EagleDrafter(EagleConfig.from_target(target), target=target, init_from_target=True)
    elif kind == "peagle":
        from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter
        d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=4096), target=target)
        d.set_draft_vocab(torch.arange(4096), target=target)
    else:
        from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
        d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=4096), target=target)
        d.set_draft_vocab(torch.arange(4096), target=target)
    prompt = tok("def fibonacci(n):")["input_ids"]
    plain = engine.generate(target, [prompt], max_new_tokens=16)
    spec = engine.generate(target, [prompt], drafter=d.eval(), max_new_tokens=16, num_draft_tokens=3)
    assert spec.sequences == plain.sequences


def test_tensor_differences_are_counted_past_the_names_shown():
    from drafterkit.drafters.base import tensor_mismatch

    said = tensor_mismatch({f"t{i:02d}": (1,) for i in range(12)}, {"x": (2,)})
    assert said == ("missing tensors ['t00', 't01', 't02', 't03', 't04', 't05', 't06', 't07'] (and 4 more), "
                    "unexpected tensors ['x']")
    assert tensor_mismatch({"a": (1, 2)}, {"a": (2, 1)}) == "tensor a has shape (2, 1), expected (1, 2)"
    assert tensor_mismatch({"a": (1,)}, {"a": (1,)}) is None
