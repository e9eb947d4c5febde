"""Every drafter kind trains on hybrid targets (recurrent layers beside attention: Qwen3.5, Qwen3-Next, Nemotron-H,
Granite-4.0-H, Falcon-H1, LFM2, Jamba, Bamba, Zamba2) and on the 2026 attention families Gemma-4 (per-layer
``head_dim``) and DeepSeek-V3 (multi-head latent attention): tiny seeded random targets
(``tests/families_hybrid.py``) trained 2 steps through ``drafterkit train``'s path, the loss finite, trainable
parameters moved, the target untouched.

Training reads only the target's hidden states, so nothing is refused for its recurrent layers; what of a recipe
decodes with the target (the in-training evaluation, ``data.regenerate``) is refused at recipe validation in one
line while ``decode.generate`` refuses the target (``train.target_decoding``); the training cells set ``eval.every=0
eval.at_end=false``, and one test runs the at-end evaluation where the decoder verifies the target's chains. Heads
start from the target's last layer whose attention maps (a hybrid's last full-attention layer), or fresh with one
printed line where none maps (DeepSeek-V3; Zamba2, whose shared attention reads twice the hidden width). Each
trained drafter then decodes equal to transformers' greedy generate or is refused by ``decode.generate`` up front,
and the test records which (``scripts/support_matrix.py`` writes the cells into docs/support-matrix.md)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from families import one_thread  # noqa: F401 (an autouse fixture: one intra-op thread)
from conftest import private_home, write_chats
from families_hybrid import HYBRID_FAMILIES, HYBRID_RECURRENT, build_hybrid, hybrid_config, save_hybrid

from drafterkit.cli import main
from drafterkit.train.recipe import RecipeError, recipe_from_dict

KIND_OPTIONS = {  # tiny, 2 steps; the EAGLE-3-layout heads over the whole 320-token vocabulary
    "draft_lm": {"init": "truncated", "num_layers": 1},
    "medusa": {"num_heads": 2},
    "eagle": {"ttt_steps": 1},
    "eagle3": {"ttt_steps": 2},
    "peagle": {"num_depths": 3},
    "dflash": {"block_size": 4, "num_layers": 1, "num_anchors": 4},
    "dspark": {"block_size": 4, "num_layers": 1, "num_anchors": 4, "markov_rank": 8},
}
#: a truncated draft LM reaches the family's first attention layer (all-recurrent first layers are refused)
DRAFT_LM_LAYERS = {"qwen3_5": 3, "qwen3_5_moe": 3, "qwen3_next": 3, "nemotron_h": 2, "granite_h": 2, "lfm2": 3,
                   "lfm2_moe": 3, "jamba": 2, "bamba": 2, "zamba2": 2}
CHATS = [(f"question {i}: list the days of the week", f"answer {i}: Monday, Tuesday, Wednesday.") for i in range(6)]
NO_EVAL = {"every": 0, "at_end": False, "k": 2}
CHAINS_ONLY = ("tree drafts need", "dynamic trees need")  # decode's refusal of DFlash's and DSpark's trees
CHAIN_KINDS = ("dflash", "dspark")  # the kinds that propose chains only (drafters.kinds: trees=False)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One private DRAFTERKIT_HOME and chat JSONL for the module; target folders built on first use."""
    yield from private_home(tmp_path_factory.mktemp("hybrids"), CHATS)


def _folder(home: Path, family: str) -> Path:
    folder = home / family
    if not (folder / "config.json").is_file():
        save_hybrid(family, folder)
    return folder


def _recipe(home: Path, family: str, kind: str, **sections) -> dict:
    return {"output_dir": str(home / "runs" / f"{family}-{kind}"), "target": {"name_or_path": str(home / family)},
            "drafter": {"kind": kind, "options": {**KIND_OPTIONS[kind], **(
                {"num_layers": DRAFT_LM_LAYERS.get(family, 1)} if kind == "draft_lm" else {})}},
            "data": {"source": "jsonl", "path": str(home / "chat.jsonl"), "max_length": 48},
            "train": {"max_steps": 2, "batch_size": 2, "resume": "never"}, "eval": NO_EVAL,
            "logging": {"trackers": []}, **sections}


def _train_cli(home: Path, family: str, kind: str, capsys) -> tuple[dict, str, object]:
    """Train through ``drafterkit train`` (the CLI's ``main``, in process); returns ``(the run's JSON report, stdout,
    the recipe)``."""
    data = _recipe(home, family, kind)
    path = home / f"{family}-{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    rc = main(["train", str(path)])
    out, err = capsys.readouterr()
    # (not "Traceback" not in err: transformers' one-time warning that Mamba falls back to its PyTorch kernels can
    # hit a stream an earlier test's capture closed, which the logging module reports with a traceback of its own)
    assert rc == 0 and "drafterkit train: error" not in err, err
    report = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))
    return report, out, recipe_from_dict(data)


def _check_trained(recipe, report: dict) -> None:
    """The loss is finite; the drafter's trainable tensors moved from the init the run built (rebuilt here with the
    run's seed, as ``train.prepare.setup_run`` builds it); the target loaded by the run is frozen (the loop asserts
    it after its last step) and its weights on disk are the ones this module saved."""
    from accelerate.utils import set_seed

    from drafterkit.assets.target import load_target
    from drafterkit.drafters import load_drafter
    from drafterkit.train.strategies import get_strategy

    assert report["global_step"] == 2 and math.isfinite(report["final_loss"]), report
    set_seed(recipe.train.seed)
    target, tok = load_target(recipe.target.name_or_path, dtype="float32")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    init = get_strategy(recipe.drafter.kind).build(recipe, target, tok)
    trainable = {n for n, p in init.named_parameters() if p.requires_grad}
    init = init.state_dict()
    trained = load_drafter(recipe.paths.last / "drafter", target).state_dict()
    assert all(torch.isfinite(v).all() for v in trained.values() if v.is_floating_point())
    moved = [k for k in trainable & trained.keys() if not torch.equal(trained[k], init[k])]
    assert moved, f"no trainable tensor of the {recipe.drafter.kind} drafter moved"
    assert not any(p.requires_grad for p in target.parameters())
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


#: families whose heads start fresh: the decoder layer class with no attention to copy (DeepSeek-V3's latent
#: attention; Zamba2's shared attention block reads the hidden state beside the embeddings, twice the width)
FRESH = {"deepseek_v3": "DeepseekV3DecoderLayer", "zamba2": "Zamba2HybridLayer"}
_TRAINED: dict[tuple[str, str], Path] = {}  # (family, kind) -> the drafter folder trained for it
#: the families every kind trains, decodes and exports on in the fast tier (Gated DeltaNet, Mamba-2 beside
#: attention, latent attention with fresh heads); the full suite (`--all`) adds the rest, marked ``matrix``
FAST_FAMILIES = ("qwen3_5", "nemotron_h", "deepseek_v3")
PER_FAMILY = [pytest.param(f, marks=() if f in FAST_FAMILIES else pytest.mark.matrix) for f in HYBRID_FAMILIES]


def trained(home: Path, family: str, kind: str, capsys) -> Path:
    """The drafter folder of ``kind`` trained 2 steps on ``family``, by whichever test asks first (the decoding and
    export tests selected alone train what they read)."""
    if (family, kind) not in _TRAINED:
        _folder(home, family)
        _TRAINED[family, kind] = _train_cli(home, family, kind, capsys)[2].paths.last / "drafter"
    return _TRAINED[family, kind]


@pytest.mark.parametrize("kind", list(KIND_OPTIONS))
@pytest.mark.parametrize("family", PER_FAMILY)
def test_kind_trains(home, family, kind, capsys, record_property):
    """Each kind on each family, 2 steps through the CLI: finite loss, trainable tensors moved, target frozen.
    Qwen3.5's full-attention layer (2 of 4) is gated (its q_proj holds each head's query and output gate); a
    DeepSeek-V3 or Zamba2 head starts fresh and the run says so in one line (the others print no such line)."""
    _folder(home, family)
    report, out, recipe = _train_cli(home, family, kind, capsys)
    _check_trained(recipe, report)
    fresh = [line for line in out.splitlines() if "start fresh" in line]
    if family in FRESH and kind in ("eagle", "eagle3", "peagle", *CHAIN_KINDS):
        # one line naming the kind, the layer class found without attention to copy, the family and the option
        (line,) = fresh
        assert all(w in line for w in (f"the {kind} drafter", FRESH[family], f"this {family} target",
                                       "drafter.options.init_from_target_layer=false")), line
    else:
        assert fresh == [], fresh
    _TRAINED[family, kind] = recipe.paths.last / "drafter"
    record_property("cell", "trains" + (" (fresh layers: no q/k/v to copy)" if fresh else ""))


@pytest.mark.parametrize("family", PER_FAMILY)
def test_decodes_exactly_or_is_refused_up_front(home, family, capsys, record_property):
    """Plain decoding and each trained kind as a chain (K=3), a static and a dynamic tree: equal to transformers'
    greedy generate token for token, or refused by ``decode.generate`` before any token with one ValueError (a
    recurrent target the decoder does not roll back; trees on one it rolls back; DFlash's and DSpark's trees).
    Records what decodes and what is refused."""
    from families import family_prompts

    from drafterkit.decode import generate
    from drafterkit.drafters import load_drafter

    target, _ = build_hybrid(family)
    prompts = family_prompts()
    ref = [target.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    done, refused = [], {}
    for kind in [None, *KIND_OPTIONS]:
        drafter = None if kind is None else load_drafter(trained(home, family, kind, capsys), target).eval()
        for tree in (None, "2,2,1", "dynamic:6:3:2") if kind else (None,):
            try:
                got = generate(target, prompts, drafter=drafter, max_new_tokens=8, eos_token_id=[],
                               num_draft_tokens=3, tree=tree).sequences
            except ValueError as exc:  # decode's refusals name the recurrent layers or the chains-only kind
                if "recurrent" not in str(exc) and not str(exc).startswith(CHAINS_ONLY):
                    raise
                refused.setdefault(str(exc).split(":")[0] if kind in CHAIN_KINDS else str(exc), []).append(
                    f"{kind or 'plain'} {tree or 'chain'}")
                continue
            assert got == ref, (kind, tree)
            done.append(f"{kind or 'plain'} {tree or 'chain'}")
    chains = [d for d in done if d.endswith("chain")]
    cell = f"exact: {len(chains)} of {len(KIND_OPTIONS) + 1} chains, {len(done) - len(chains)} trees"
    # the reason after "target T (family) has recurrent / linear-attention layers (its ... layers ...)"
    reasons = sorted({re.sub(r"^.*?layers \([^)]*\):? ?", "", r).split(";")[0][:160]
                      for r in refused if not r.startswith(CHAINS_ONLY)})
    if reasons:
        cell += f"; refused up front: {len(sum(refused.values(), []))} ({' / '.join(reasons)})"
    record_property("cell", cell)
    if family not in HYBRID_RECURRENT:  # attention throughout: everything decodes (DFlash, DSpark: chains only)
        assert len(done) == 1 + 3 * len(KIND_OPTIONS) - 2 * len(CHAIN_KINDS), refused


EXPORTS = {"draft_lm": "hf-assistant", "medusa": "medusa", "eagle3": "vllm-eagle3", "peagle": "vllm-peagle",
           "dflash": "vllm-dflash", "dspark": "vllm-dspark"}


@pytest.mark.parametrize("family", PER_FAMILY)
def test_exports_load_back(home, family, capsys, record_property):
    """Each trained kind's export (``drafters.export.writers.export``) loads back (the engine layouts with drafterkit's
    export loaders, hf-assistant in transformers; Medusa's as its safetensors), and where ``decode.generate``
    verifies the target a chain of the loaded export equals transformers' greedy generate."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from drafterkit.decode import generate
    from drafterkit.drafters.export.writers import (export, load_dflash_export, load_dspark_export, load_eagle3_export,
                                                    load_peagle_export)
    from families import family_prompts

    target, _ = build_hybrid(family)
    prompts = family_prompts()
    ref = [target.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    loaders = {"vllm-eagle3": load_eagle3_export, "vllm-peagle": load_peagle_export,
               "vllm-dflash": load_dflash_export, "vllm-dspark": load_dspark_export}
    loaded, exact = [], []
    for kind, fmt in EXPORTS.items():
        ckpt = trained(home, family, kind, capsys)
        out = export(ckpt, fmt, home / "exports" / f"{family}-{fmt}", target=str(home / family))
        if fmt == "medusa":
            assert all(torch.isfinite(t).all() for t in load_file(str(out / "model.safetensors")).values())
            loaded.append(fmt)
            continue
        drafter = AutoModelForCausalLM.from_pretrained(out).eval() if fmt == "hf-assistant" else \
            loaders[fmt](out, target)
        loaded.append(fmt)
        try:
            got = generate(target, prompts, drafter=drafter, max_new_tokens=8, eos_token_id=[],
                           num_draft_tokens=3).sequences
        except ValueError as exc:  # the decoder refuses the target up front
            assert "recurrent" in str(exc), exc
            continue
        assert got == ref, fmt
        exact.append(fmt)
    assert len(loaded) == len(EXPORTS)
    record_property("cell", f"{len(loaded)} of {len(EXPORTS)} load back; chains exact: {len(exact)} of "
                            f"{len(loaded) - 1} (medusa's layout: weights only)")


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "jamba"])
def test_the_in_training_evaluation_runs_where_the_decoder_verifies_the_target(home, family, tmp_path):
    """Where ``decode.generate`` verifies a hybrid target's chains, the recipe's in-training evaluation is not
    refused: the at-end evaluation decodes held-out prompts with the trained drafter and saves best/ by its tau."""
    from drafterkit.decode.recurrent import recurrent_problem
    from drafterkit.train.loop import train

    if recurrent_problem(hybrid_config(family)) is not None:
        pytest.skip(f"decode.generate does not verify {family} yet: {recurrent_problem(hybrid_config(family))}")
    _folder(home, family)
    chats = write_chats(tmp_path / "chat.jsonl", CHATS * 5)
    data = _recipe(home, family, "eagle3", eval={"at_end": True, "k": 2, "num_prompts": 2, "max_new_tokens": 6})
    data["output_dir"], data["data"] = str(tmp_path / "run"), {**data["data"], "path": str(chats),
                                                               "heldout_fraction": 0.2}
    recipe = recipe_from_dict(data)
    result = train(recipe)
    assert result.global_step == 2 and math.isfinite(result.losses[-1])
    ev = json.loads((recipe.paths.best / "eval.json").read_text())
    assert ev["tau"] >= 1.0 and ev["committed"] > 0


def test_what_decodes_is_refused_at_validation_while_the_decoder_refuses_the_target(tmp_path):
    """Zamba (Mamba layers whose state is not recorded per position; ``decode.generate`` refuses it): the default
    in-training evaluation and ``data.regenerate`` are refused in one line naming the keys and the fix; without them
    the recipe validates. The folder holds only config.json: nothing loads."""
    from transformers import AutoConfig

    AutoConfig.for_model("zamba", vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, attention_head_dim=16, attn_layer_period=2,
                         attn_layer_offset=1, mamba_d_state=8, n_mamba_heads=2,
                         tie_word_embeddings=False).save_pretrained(tmp_path / "zamba")
    data = _recipe(tmp_path, "zamba", "eagle3", eval={"every": 5, "k": 2})
    data["data"]["regenerate"] = True
    with pytest.raises(RecipeError) as err:
        recipe_from_dict(data)
    line = str(err.value).splitlines()[-1].removeprefix("(top level): ")
    assert line.startswith(f"eval.every=5 eval.at_end=true data.regenerate=true: these decode with the target, and "
                           f"target.name_or_path: {tmp_path / 'zamba'} (zamba) has recurrent / linear-attention layers")
    assert "keeps only its final state" in line
    assert line.endswith("training alone reads only the target's hidden states and trains every drafter kind on it: "
                         "set eval.every=0 eval.at_end=false data.regenerate=false and measure the drafter once the "
                         "decoder verifies this target")
    for kind in KIND_OPTIONS:  # a draft LM reaches Zamba's first layer with shared attention (2)
        recipe_from_dict(_recipe(tmp_path, "zamba", kind), ["drafter.options.num_layers=3"] * (kind == "draft_lm"))


@pytest.mark.parametrize("family", sorted(DRAFT_LM_LAYERS))
def test_a_draft_lm_of_recurrent_layers_only_is_refused(home, family):
    """The first layer of these targets is recurrent: a one-layer truncated draft LM would have no attention layer,
    which transformers cannot run with a cache; refused at validation naming the layer count that works."""
    _folder(home, family)
    data = _recipe(home, family, "draft_lm")
    data["drafter"]["options"]["num_layers"] = 1
    with pytest.raises(RecipeError) as err:
        recipe_from_dict(data)
    first = DRAFT_LM_LAYERS[family] - 1
    assert str(err.value).splitlines()[-1].endswith(
        f"target are all recurrent (its first attention layer is layer {first}), and a draft LM without an attention "
        "layer cannot decode (transformers builds its attention masks from the cache's attention layers); set "
        f"drafter.options.num_layers to at least {first + 1}")


@pytest.mark.parametrize("family", HYBRID_RECURRENT)
def test_features_read_by_hooks_are_transformers_hidden_states(family):
    """The hooks training reads features through (the body's embedding, layers and final norm, named per family:
    Nemotron-H's ``embeddings`` / ``norm_f``, Falcon-H1's ``final_layernorm``, LFM2's ``embedding_norm``) give
    transformers' ``hidden_states`` at every id, the last after the final norm."""
    from drafterkit.train.features import target_hidden

    target, _ = build_hybrid(family)
    ids = torch.tensor([[5, 9, 11, 40, 7, 3], [8, 8, 21, 30, 2, 0]])
    mask = torch.tensor([[1] * 6, [1] * 5 + [0]])
    layers = list(range(1, target.config.num_hidden_layers + 1))
    hooked = target_hidden(target, ids, mask, layers)
    ref = target_hidden(target, ids, mask, layers, method="hidden_states")
    for i, a, b in zip(layers, hooked, ref):
        assert torch.allclose(a, b, atol=1e-5), (family, i)


#: family -> the decoder layer a head starts from (its last whose attention maps)
SOURCE = {"qwen3_5": 2, "qwen3_next": 2, "nemotron_h": 1, "granite_h": 1, "falcon_h1": 3, "lfm2": 2, "gemma4": 3,
          "jamba": 3, "bamba": 3}


@pytest.mark.parametrize("family", sorted(SOURCE))
def test_the_head_starts_from_the_last_attention_layer(family):
    """An EAGLE head's layer computes the source layer's q (the query rows of a gated q_proj), k, v and o, and takes
    its head sizes from that layer's config (Gemma-4's full-attention layers: ``global_head_dim`` 32)."""
    from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
    from drafterkit.drafters.target.layers import decoder_layers, source_layer_ids

    target, _ = build_hybrid(family)
    assert source_layer_ids(target) == [SOURCE[family]]
    head = EagleDrafter(EagleConfig.from_target(target), target=target, init_from_target=True)
    src = decoder_layers(target)[SOURCE[family]]
    attn = getattr(src, "self_attn", None) or src.mixer
    d = head.config.head_dim
    assert d == (32 if family == "gemma4" else 16)
    x = torch.randn(3, target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    q = attn.q_proj(x)
    if family in ("qwen3_5", "qwen3_next"):  # gated: per head [query (d); output gate (d)]
        q = q.view(3, -1, 2 * d)[..., :d].reshape(3, -1)
    mine = head.layer.self_attn
    assert torch.allclose(mine.q_proj(x), q, atol=1e-6)
    assert torch.equal(mine.k_proj.weight, attn.k_proj.weight) and torch.equal(mine.v_proj.weight, attn.v_proj.weight)
    o = getattr(attn, "o_proj", None) or attn.out_proj
    assert torch.equal(mine.o_proj.weight, o.weight)


@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1", "lfm2"])
def test_the_heads_final_norm_starts_from_the_familys_final_norm(family):
    """Nemotron-H's ``norm_f``, Falcon-H1's ``final_layernorm``, LFM2's ``embedding_norm`` (after the last layer):
    the EAGLE-3 head's final norm starts at its scale."""
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter, copy_final_norm
    from drafterkit.drafters.target.layers import target_body

    target, _ = build_hybrid(family)
    final = target_body(target)[2]
    with torch.no_grad():
        final.weight.normal_()
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64), target=target)
    copy_final_norm(head, target)
    x = torch.randn(3, target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(head.norm(x), final(x), atol=1e-5)
