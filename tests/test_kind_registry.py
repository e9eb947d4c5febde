"""One registry per kind: a kind defined in the test folder (``tests/toy_kind.py``) and registered at runtime is
trained through the ``drafterkit train`` verb, decoded exactly, loaded and exported, with no edit to the package;
and the two tables a kind has (the drafter registry and training's own line) agree for every built-in kind."""

from __future__ import annotations

import json

import pytest
import toy_kind
from conftest import random_chats, training_world

from drafterkit.drafters import kinds
from drafterkit.train import options


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy kind registered (both entries) and a tiny training world: ``(root, target, tokenizer)``."""
    from drafterkit.train import strategies

    kinds.register_kind(toy_kind.KIND)
    strategies.register_kind("toy", toy_kind.TRAINING)
    root = tmp_path_factory.mktemp("toy")
    try:
        with training_world(root, random_chats([12] * 24, 6)) as (target, tok):
            yield root, target, tok
    finally:
        kinds.unregister_kind("toy")
        strategies.unregister_kind("toy")


def _recipe_file(root) -> str:
    from drafterkit.train.recipe import recipe_from_dict

    data = {
        "output_dir": str(root / "run"),
        "target": {"name_or_path": str(root / "target")},
        "drafter": {"kind": "toy", "options": {}},
        "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 48, "heldout_fraction": 0.1},
        "optim": {"lr": 1e-2, "schedule": "constant"},
        "train": {"max_steps": 3, "batch_size": 2, "grad_accum": 1, "log_every": 1, "resume": "never"},
        "eval": {"every": 0, "at_end": False, "num_prompts": 2, "max_new_tokens": 6, "k": 3},
        "logging": {"trackers": []},
    }
    path = root / "toy.yaml"
    path.write_text(recipe_from_dict(data).to_yaml())
    return str(path)


def test_every_table_reads_the_registered_kind(toy):
    from drafterkit.drafters.export.writers import FORMATS
    from drafterkit.train.recipe import RecipeError, recipe_from_dict

    assert "toy" in kinds.trainable_kinds() and "toy" in kinds.feature_kinds() and FORMATS["toy-plain"] == "toy"
    assert kinds.max_draft_tokens("toy", {}) is None and "toy" in options.feature_kinds()
    base = {"output_dir": "x", "drafter": {"kind": "toy", "options": {"noise": 0.1}}}
    assert recipe_from_dict(base).drafter.parsed_options().noise == 0.1
    with pytest.raises(RecipeError, match="nope"):
        recipe_from_dict({**base, "drafter": {"kind": "toy", "options": {"nope": 1}}})
    with pytest.raises(ValueError, match="already registered"):
        kinds.register_kind(toy_kind.KIND)


def test_the_toy_kind_trains_decodes_exactly_and_exports(toy, capsys):
    from drafterkit.cli import main
    from drafterkit.decode import generate
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.base import ExportError
    from drafterkit.drafters.export.writers import export

    root, target, _ = toy
    assert main(["train", _recipe_file(root)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["global_step"] == 3
    drafter = load_drafter(root / "run", target=target)
    assert isinstance(drafter, toy_kind.ToyDrafter)
    prompts = [[1, 5, 9, 14], [3, 7, 2000, 11, 40]]
    plain = generate(target, prompts, max_new_tokens=12)
    spec = generate(target, prompts, drafter=drafter, max_new_tokens=12, num_draft_tokens=3)
    assert spec.sequences == plain.sequences and spec.stats.drafted > 0

    out = export(root / "run", "toy-plain", root / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ToyHead"] and config["drafterkit"]["source"]["model_sha256"]
    card = (out / "README.md").read_text()
    assert "# Toy head" in card and "toy: one linear layer" in card and "library_name: drafterkit" in card
    with pytest.raises(ExportError, match="formats for 'toy': \\['toy-plain'\\]"):
        export(root / "run", "medusa", root / "wrong")


@pytest.mark.parametrize("kind", kinds.trainable_kinds())
def test_training_and_the_registry_agree_on_each_kind(kind):
    """``train.options.KINDS`` is training's own line per kind (read without torch when a recipe is validated);
    what both tables say of a kind, they say alike."""
    assert kind in options.KINDS and options.KINDS[kind].reads_features == kinds.KINDS[kind].reads_features


def test_the_vllm_runner_serves_each_method_as_its_export_format_says():
    """``speceval/vllm_runner.py`` runs in vLLM's venv and imports nothing of drafterkit, so the methods with
    options (P-EAGLE: EAGLE-3 with parallel drafting) are a table of its own: the same as each format's."""
    from drafterkit.speceval.vllm_runner import SPEC_METHODS

    for method, (fmt, _) in kinds.serve_formats().items():
        assert SPEC_METHODS.get(method, {"method": method}) == fmt.speculative_config(), method


def test_quickstarts_kind_help_lists_the_trainable_kinds(toy):
    """``drafterkit quickstart --help`` answers without importing ``drafters/``; its list of kinds is training's table
    (``train.options.KINDS``, no torch), a registered kind included, each once."""
    import argparse
    import re

    from drafterkit.quickstart.args import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    (action,) = [a for a in p._actions if "--kind" in a.option_strings]
    listed = re.match(r"drafter kind: ([\w |]+?) \(", action.help).group(1).split(" | ")
    assert sorted(listed) == sorted(options.KINDS) == kinds.trainable_kinds() and "toy" in listed
