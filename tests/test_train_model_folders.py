"""Every model folder a recipe names, broken, is a one-line CLI error (exit 2), never a traceback.

``drafter.options.checkpoint`` (``init: checkpoint``, with and without LoRA) and ``target.name_or_path``
as a local folder, through ``drafterkit train RECIPE key=value ...``: missing, config.json without
weights, a drafterkit checkpoint of another kind, a vocabulary that is not the target's, a torn
safetensors file. Tiny seeded random Llamas with the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_llama, training_world

from drafterkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 49152  # SmolLM2's


def _tear(folder: Path, name: str = "model.safetensors") -> Path:
    """Cut ``folder/name`` to half its size, as an interrupted copy leaves it."""
    file = folder / name
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target folder, a chat JSONL, a draft_lm recipe file, and one folder per broken case."""
    root = tmp_path_factory.mktemp("folders")
    chats = [(f"question {i}", f"answer {i}") for i in range(8)]
    with training_world(root, chats) as (target, tok):
        _write_broken_folders(root, target, tok)
        yield root


def _write_broken_folders(root: Path, target, tok) -> None:
    """The draft_lm recipe file and one folder per broken case, beside ``root/target``."""
    from drafterkit.drafters.draft_lm import DraftLM
    from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter

    recipe = {
        "output_dir": str(root / "run"),
        "target": {"name_or_path": str(root / "target")},
        "drafter": {"kind": "draft_lm", "options": {"init": "truncated", "num_layers": 1}},
        "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 64},
        "train": {"max_steps": 1, "batch_size": 2, "resume": "never"},
        "eval": {"every": 0, "at_end": False},
        "logging": {"trackers": []},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))

    small = tiny_llama(1, vocab_size=VOCAB, hidden_size=32, layers=1)
    small.config.eos_token_id = tok.eos_token_id
    small.save_pretrained(root / "hf-good")
    small.config.save_pretrained(root / "config-only")  # config.json, no weights
    small.save_pretrained(root / "hf-torn")
    _tear(root / "hf-torn")
    other_vocab = tiny_llama(2, vocab_size=128, hidden_size=32, layers=1)
    other_vocab.save_pretrained(root / "hf-vocab128")
    DraftLM.from_model(other_vocab).save_pretrained(root / "draft-vocab128")
    padded = tiny_llama(3, vocab_size=VOCAB + 64, hidden_size=32, layers=1)  # within decoding's padding allowance
    padded.config.eos_token_id = tok.eos_token_id
    padded.save_pretrained(root / "hf-vocab+64")
    DraftLM.from_model(padded).save_pretrained(root / "draft-vocab+64")
    draft = DraftLM.from_target(target, 1)
    draft.save_pretrained(root / "draft-good")
    draft.save_pretrained(root / "draft-torn")
    _tear(root / "draft-torn")
    MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).save_pretrained(root / "medusa")
    EagleDrafter(EagleConfig.from_target(target), target=target).save_pretrained(root / "eagle")
    e3 = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=48), target=target)
    e3.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    e3.save_pretrained(root / "eagle3")
    (root / "run-eagle3" / "checkpoints" / "best").mkdir(parents=True)  # a run output_dir of another kind
    e3.save_pretrained(root / "run-eagle3" / "checkpoints" / "best" / "drafter")
    for name in ("target-config-only", "target-torn", "target-no-tokenizer"):
        target.save_pretrained(root / name)
    for name in ("target-config-only", "target-torn"):
        tok.save_pretrained(root / name)
    (root / "target-config-only" / "model.safetensors").unlink()
    _tear(root / "target-torn")


def _train(world, tmp_path, capsys, *overrides) -> tuple[int, str]:
    rc = main(["train", str(world / "recipe.yaml"), f"output_dir={tmp_path / 'run'}", *overrides])
    return rc, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("drafterkit train: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _checkpoint(path, lora: bool) -> list[str]:
    return ["drafter.options.init=checkpoint", f"drafter.options.checkpoint={path}"] + \
        (["drafter.options.lora={r: 4}"] if lora else [])


CHECKPOINT_CASES = [
    ("missing", "does not exist; init: checkpoint needs a draft_lm checkpoint"),
    ("config-only", "holds config.json but no weights (model.safetensors / pytorch_model.bin); save the model "
                    "there with save_pretrained"),
    ("medusa", "is a medusa checkpoint, init: checkpoint needs a draft_lm checkpoint or a transformers causal-LM "
               "folder"),
    ("eagle", "is an eagle checkpoint, init: checkpoint needs a draft_lm checkpoint"),
    ("eagle3", "is an eagle3 checkpoint, init: checkpoint needs a draft_lm checkpoint"),
    ("run-eagle3", "is an eagle3 checkpoint"),
    ("hf-torn", "has model.safetensors, which is torn or partial (its header describes"),
    ("draft-torn", "model.safetensors is torn or partial (its header describes"),
]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("case, says", CHECKPOINT_CASES, ids=[c for c, _ in CHECKPOINT_CASES])
def test_a_broken_draft_checkpoint_is_a_one_line_cli_error(world, tmp_path, capsys, case, says, lora):
    rc, err = _train(world, tmp_path, capsys, *_checkpoint(world / case, lora))
    line = _one_line_error(err)
    assert rc == 2
    assert "drafter.options.checkpoint" in line and str(world / case) in line and says in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any training


VOCAB_CASES = [("hf-vocab128", 128), ("draft-vocab128", 128), ("hf-vocab+64", VOCAB + 64),
               ("draft-vocab+64", VOCAB + 64)]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("case, size", VOCAB_CASES, ids=[c for c, _ in VOCAB_CASES])
def test_a_checkpoint_of_another_vocabulary_is_refused_when_the_recipe_is_validated(world, tmp_path, capsys, case,
                                                                                     size, lora):
    # Training compares the drafter's distribution with the target's over the whole vocabulary, so even the
    # LM-head padding rows decoding tolerates (64 here) are refused, before the target loads.
    from drafterkit.train.recipe import RecipeError, load_recipe

    says = (f"drafter.options.checkpoint: {world / case} has a vocabulary of {size} tokens but the target has "
            f"{VOCAB}: a draft LM trains on the target's distribution over its whole vocabulary")
    with pytest.raises(RecipeError) as exc:
        load_recipe(world / "recipe.yaml", _checkpoint(world / case, lora))
    assert says in str(exc.value) and "init=truncated" in str(exc.value)
    rc, err = _train(world, tmp_path, capsys, *_checkpoint(world / case, lora))
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_hub_target_gets_the_same_vocabulary_refusal_from_the_loaded_models(world):
    # A target whose config is not local is checked by the build, on the loaded models, with the same line.
    from drafterkit.assets.target import load_target
    from drafterkit.train.strategies.draft_lm import DraftLMStrategy

    target, _ = load_target(str(world / "target"))
    with pytest.raises(ValueError, match=rf"has a vocabulary of {VOCAB + 64} tokens but the target has {VOCAB}:"):
        DraftLMStrategy._from_checkpoint(str(world / "hf-vocab+64"), target)


TARGET_CASES = [
    ("missing", "does not exist"),
    ("target-config-only", "holds config.json but no weights (model.safetensors / pytorch_model.bin)"),
    ("draft-good", "is a drafterkit draft_lm drafter checkpoint, not a target model"),
    ("target-torn", "has model.safetensors, which is torn or partial"),
    ("target-no-tokenizer", "holds no tokenizer"),
]


@pytest.mark.parametrize("case, says", TARGET_CASES, ids=[c for c, _ in TARGET_CASES])
def test_a_broken_target_folder_is_a_one_line_cli_error(world, tmp_path, capsys, case, says):
    rc, err = _train(world, tmp_path, capsys, f"target.name_or_path={world / case}")
    line = _one_line_error(err)
    assert rc == 2
    assert line.startswith("drafterkit train: error: target.name_or_path: target ") and says in line, line
    assert str(world / case) in line and "a Hub id, or 'smollm2-135m'" in line


def test_the_lora_base_without_weights_through_the_console_script(world, tmp_path):
    # The case, as a user meets it: `drafterkit train` in its own process, stderr as printed.
    cmd = [sys.executable, "-m", "drafterkit.train", str(world / "recipe.yaml"), f"output_dir={tmp_path / 'run'}",
           *_checkpoint(world / "config-only", lora=True)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr
    line = _one_line_error(out.stderr)
    assert f"{world / 'config-only'} holds config.json but no weights" in line


@pytest.mark.parametrize("case", ["hf-good", "draft-good"])
def test_whole_checkpoints_still_start_the_draft_lm(world, case):
    # The checks refuse only what is broken: a transformers folder and a draft_lm checkpoint load as before,
    # in fp32 with the weights as saved.
    from safetensors.torch import load_file

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.strategies import get_strategy

    target, tok = load_target(str(world / "target"))
    recipe = load_recipe(world / "recipe.yaml", _checkpoint(world / case, lora=False))
    drafter = get_strategy("draft_lm").build(recipe, target, tok)
    saved = load_file(str(world / case / "model.safetensors"))
    own = drafter.own_state_dict() if case == "draft-good" else drafter.lm.state_dict()
    assert drafter.training and all(p.dtype == torch.float32 for p in drafter.parameters())
    assert all(torch.equal(own[k], v) for k, v in saved.items() if k in own) and len(saved) > 2
