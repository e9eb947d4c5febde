"""The support matrix, family x column, each cell a test: tiny seeded random targets of every claimed family
(``tests/families.py``), saved as target folders with a tokenizer.

Columns: ``plain`` (decoding through the engine equals transformers' greedy ``generate``); ``suffix`` (suffix
decoding, model-free, decodes as a chain, a static and a dynamic tree equal to plain greedy); each drafter kind
(trained 2 steps through ``drafterkit train`` (the CLI's ``main``, in process), then decoded as a chain, a
static tree and a dynamic tree, each equal to plain greedy in fp32); each export format of the kind (written by
``drafters.export.writers.export`` and loaded back: the engine layouts with drafterkit's export loaders, decoding equal
to plain greedy; Medusa's as its safetensors). A cell that cannot work is refused when the recipe is
validated: the test then checks the one-line refusal and records it.

``scripts/support_matrix.py`` runs this module with ``--junitxml`` and writes ``docs/support-matrix.md`` from
the outcomes and each test's recorded ``cell`` property (``pass`` or the refusal line).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import private_home
from families import FAMILIES, family_prompts, one_thread, save_family  # noqa: F401 (one_thread: a fixture)

from drafterkit.cli import main
from drafterkit.decode import generate

pytestmark = pytest.mark.matrix  # ~165 tests, minutes on 2 cores: `-m "not matrix"` leaves them out

KIND_OPTIONS = {  # tiny, 2 steps: what each kind trains here
    "draft_lm": {"init": "truncated", "num_layers": 1},
    "medusa": {"num_heads": 2},
    "eagle": {"ttt_steps": 1},
    "eagle3": {"draft_vocab_size": 64, "ttt_steps": 2},
    "peagle": {"draft_vocab_size": 64, "num_depths": 3},
    "dflash": {"block_size": 4, "num_layers": 1, "num_anchors": 4},
    "dspark": {"block_size": 4, "num_layers": 1, "num_anchors": 4, "markov_rank": 8},
}
EXPORTS = {"draft_lm": ["hf-assistant"], "medusa": ["medusa"], "eagle": [], "eagle3": ["vllm-eagle3"],
           "peagle": ["vllm-peagle"], "dflash": ["vllm-dflash"], "dspark": ["vllm-dspark"]}
REFUSED: dict[tuple[str, str], str] = {}  # (family, kind) -> the refusal its recipe check gives
#: kinds refusing tree drafts, and what they say
CHAINS_ONLY = {"dflash": r"dflash (proposes chains only|cannot)", "dspark": r"dspark (proposes chains only|cannot)"}
NEW = 10  # new tokens per prompt
CHATS = [(f"question {i}: list the days of the week", f"answer {i}: Monday, Tuesday, Wednesday.") for i in range(6)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One private DRAFTERKIT_HOME (dataset caches) for the module."""
    yield from private_home(tmp_path_factory.mktemp("families"), CHATS)


@pytest.fixture(scope="module")
def world(home):
    """``world(family)``: ``(folder, target, plain greedy sequences)`` of ``family``, built once per module."""
    made: dict[str, tuple] = {}

    def get(family: str):
        if family not in made:
            folder = home / family
            target, _ = save_family(family, folder)
            plain = generate(target, family_prompts(), max_new_tokens=NEW, eos_token_id=[]).sequences
            made[family] = (folder, target, plain)
        return made[family]

    return get


@pytest.fixture(scope="module")
def trained(home, world):
    """``trained(family, kind)``: ``(exit code, stderr, drafter folder)`` of 2 training steps through the CLI, run
    once per module: :func:`test_kind` and :func:`test_export` share the run, and either selected alone trains it."""
    runs: dict[tuple[str, str], tuple[int, str, Path]] = {}

    def get(family: str, kind: str):
        if (family, kind) not in runs:
            runs[family, kind] = _train(home, world(family)[0], family, kind)
        return runs[family, kind]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plain(world, family, record_property):
    """Plain decoding through drafterkit's engine equals transformers' greedy generate."""
    folder, target, plain = world(family)
    for prompt, ours in zip(family_prompts(), plain):
        ids = torch.tensor([prompt])
        ref = target.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours == ref[0, len(prompt):].tolist(), family
    record_property("cell", "pass")


def _train(home: Path, folder: Path, family: str, kind: str) -> tuple[int, str, Path]:
    out = home / "runs" / f"{family}-{kind}"
    recipe = {"output_dir": str(out), "target": {"name_or_path": str(folder)},
              "drafter": {"kind": kind, "options": KIND_OPTIONS[kind]},
              "data": {"source": "jsonl", "path": str(home / "chat.jsonl"), "max_length": 48},
              "train": {"max_steps": 2, "batch_size": 2, "resume": "never"},
              "eval": {"every": 0, "at_end": False, "k": 2}, "logging": {"trackers": []}}
    path = home / f"{family}-{kind}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["train", str(path)])
    return rc, err.getvalue(), out / "checkpoints" / "last" / "drafter"


def _decodes_exactly(target, drafter, plain, kind: str) -> str:
    """Chain, static tree and dynamic tree decoding equal ``plain``; returns the cell (``pass``, or for a kind
    that proposes chains only, what it says when asked for a tree)."""
    prompts = family_prompts()
    got = generate(target, prompts, drafter=drafter, max_new_tokens=NEW, eos_token_id=[], num_draft_tokens=3)
    assert got.sequences == plain
    notes = []
    for tree in ("2,2,1", "dynamic:6:3:2"):
        if kind in CHAINS_ONLY:
            with pytest.raises(ValueError, match=CHAINS_ONLY[kind]):
                generate(target, prompts, drafter=drafter, max_new_tokens=NEW, eos_token_id=[], tree=tree)
            notes.append(tree)
            continue
        got = generate(target, prompts, drafter=drafter, max_new_tokens=NEW, eos_token_id=[], tree=tree)
        assert got.sequences == plain, tree
    return "pass" if not notes else f"pass (chains; trees refused: {kind} proposes chains only)"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_suffix(world, family, record_property):
    """Suffix decoding (model-free, nothing to train) decodes as a chain, a static and a dynamic tree equal to plain
    greedy; its global tree of earlier outputs then drafts tokens the target accepts."""
    from drafterkit.drafters.suffix import SuffixDrafter

    folder, target, plain = world(family)
    drafter = SuffixDrafter()
    cell = _decodes_exactly(target, drafter, plain, "suffix")
    again = generate(target, family_prompts(), drafter=drafter, max_new_tokens=NEW, eos_token_id=[],
                     num_draft_tokens=3)
    assert again.sequences == plain and again.stats.accepted > 0, again.stats
    record_property("cell", cell)


@pytest.mark.parametrize("kind", list(KIND_OPTIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_kind(world, trained, family, kind, record_property):
    """Trains 2 steps through the CLI, then decodes as a chain, a static and a dynamic tree equal to plain
    greedy."""
    from drafterkit.drafters import load_drafter

    folder, target, plain = world(family)
    rc, err, ckpt = trained(family, kind)
    assert "Traceback" not in err, err
    if rc == 2:  # refused when validated: one line naming the option to change
        reason = err.strip().splitlines()[-1]
        assert (family, kind) in REFUSED and REFUSED[family, kind] in reason, err
        record_property("cell", f"refused: {reason}")
        return
    assert (family, kind) not in REFUSED, f"{family} x {kind} trained where a refusal was expected"
    assert rc == 0, err
    cell = _decodes_exactly(target, load_drafter(ckpt, target).eval(), plain, kind)
    record_property("cell", cell)


@pytest.mark.parametrize("fmt", [f for fmts in EXPORTS.values() for f in fmts])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_export(home, world, trained, family, fmt, record_property):
    """The export of the checkpoint the kind's training run saved (the ``trained`` fixture) loads back; where
    drafterkit decodes the export, a chain equals plain greedy; Medusa's layout holds the trained heads under
    vLLM's names and a config that describes them."""
    from transformers import AutoModelForCausalLM

    from drafterkit.drafters.export import writers

    kind = next(k for k, fmts in EXPORTS.items() if fmt in fmts)
    if (family, kind) in REFUSED:
        record_property("cell", f"refused: {kind} is refused for {family}")
        return
    folder, target, plain = world(family)
    rc, err, ckpt = trained(family, kind)
    assert rc == 0, err
    out = writers.export(ckpt, fmt, home / "exports" / f"{family}-{fmt}", target=str(folder))
    loaders = {"vllm-eagle3": writers.load_eagle3_export, "vllm-peagle": writers.load_peagle_export,
               "vllm-dflash": writers.load_dflash_export, "vllm-dspark": writers.load_dspark_export}
    if fmt in loaders:
        drafter = loaders[fmt](out, target)
    elif fmt == "hf-assistant":
        drafter = AutoModelForCausalLM.from_pretrained(out).eval()
    else:  # medusa: the layout serving engines read; drafterkit decodes from its own checkpoint
        _check_medusa_export(out, ckpt, target)
        record_property("cell", "pass")
        return
    got = generate(target, family_prompts(), drafter=drafter, max_new_tokens=NEW, eos_token_id=[],
                   num_draft_tokens=3).sequences
    assert got == plain, fmt
    record_property("cell", "pass")


def _check_medusa_export(out: Path, ckpt: Path, target) -> None:
    """vLLM's Medusa layout of the trained heads: a config naming ``MedusaModel`` with the recipe's head count and
    the target's width and vocabulary, and each trained tensor under its vLLM name, unchanged."""
    from safetensors.torch import load_file

    from drafterkit.drafters import load_drafter

    heads, hidden = KIND_OPTIONS["medusa"]["num_heads"], target.config.hidden_size
    vocab = target.get_output_embeddings().weight.shape[0]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MedusaModel"] and cfg["model_type"] == "medusa"
    assert (cfg["num_heads"], cfg["medusa_num_heads"], cfg["hidden_size"], cfg["vocab_size"]) == \
        (heads, heads, hidden, vocab)
    tensors = load_file(str(out / "model.safetensors"))
    own = load_drafter(ckpt, target).own_state_dict()
    blocks = {k: v for k, v in own.items() if k.startswith("blocks.")}  # blocks.{k}.{j}.linear.{weight,bias}
    assert {f"blocks.{k.split('.')[1]}" for k in blocks} == {f"blocks.{i}" for i in range(heads)}
    for name, value in blocks.items():
        _, k, j, _, leaf = name.split(".")
        assert torch.equal(tensors[f"blocks.{k}.layers.{j}.{leaf}"], value), name
    if cfg["original_lm_head"]:  # heads sharing the target's LM head: written once, as lm_heads.0
        assert torch.equal(tensors["lm_heads.0.weight"], target.get_output_embeddings().weight)
    else:
        assert sorted(k for k in tensors if k.startswith("lm_heads.")) == [f"lm_heads.{i}.weight" for i in range(heads)]
        assert all(torch.equal(tensors[k], own[k]) for k in tensors if k.startswith("lm_heads."))
