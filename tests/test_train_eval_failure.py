"""An evaluation that raises inside ``drafterkit train`` ends the run with its error but loses no trained step: the
checkpoints due are written before it (``last/`` before the at-end evaluation, ``step-N`` before the periodic one).
A failing at-end evaluation used to leave no ``checkpoints/`` folder at all, even with ``train.save_every`` set."""

import json

import pytest
import torch
from conftest import random_chats, training_world

from drafterkit.train.recipe import recipe_from_dict

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target folder (hidden 32, the real SmolLM2 tokenizer) and a synthetic chat JSONL."""
    root = tmp_path_factory.mktemp("eval-failure")
    with training_world(root, random_chats([12] * 24, 6)) as loaded:
        yield root, loaded


def _recipe(root, out, **over):
    data = {
        "output_dir": str(out), "target": {"name_or_path": str(root / "target")},
        "drafter": {"kind": "draft_lm", "options": {"init": "truncated", "num_layers": 1}},
        "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 48, "heldout_fraction": 0.2},
        "optim": {"lr": 1e-2, "schedule": "constant"},
        "train": {"max_steps": 3, "batch_size": 2, "log_every": 1, "resume": "never"},
        "eval": {"every": 0, "at_end": True, "num_prompts": 1, "max_new_tokens": 4, "k": 2},
        "logging": {"trackers": []},
    }
    return recipe_from_dict(data, [f"{k}={v}" for k, v in over.items()])


class EvalFailed(RuntimeError):
    """What the patched evaluation raises (the trial's was transformers' "`crop` was called ..." RuntimeError)."""


def _failing_eval(monkeypatch, at_step: int | None = None):
    """Make training's evaluation raise (at ``at_step`` only, else always); the real one runs otherwise."""
    import drafterkit.train.loop as loop

    real = loop.evaluate
    seen = []

    def evaluate(drafter, target, prompts, recipe, **options):
        seen.append(True)
        if at_step is None or len(seen) == at_step:
            raise EvalFailed("the evaluation failed")
        return real(drafter, target, prompts, recipe, **options)

    monkeypatch.setattr(loop, "evaluate", evaluate)


def _step_of(folder) -> int:
    return json.loads((folder / "trainer_state.json").read_text())["global_step"]


def test_a_failing_at_end_evaluation_keeps_last(world, tmp_path, monkeypatch):
    from drafterkit.drafters import load_drafter
    from drafterkit.train.loop import train

    root, (target, tok) = world
    recipe = _recipe(root, tmp_path / "run")
    _failing_eval(monkeypatch)
    with pytest.raises(EvalFailed):
        train(recipe, target=target, tokenizer=tok)
    last = recipe.paths.last
    assert _step_of(last) == 3 and (last / "state").is_dir()  # resumable at the last trained step
    drafter = load_drafter(last / "drafter", target)
    assert all(torch.isfinite(p).all() for p in drafter.parameters())
    assert not recipe.paths.best.exists()  # nothing was measured


def test_a_failing_periodic_evaluation_keeps_its_step_checkpoint(world, tmp_path, monkeypatch):
    from drafterkit.train.loop import train

    root, (target, tok) = world
    recipe = _recipe(root, tmp_path / "run", **{"eval.every": 2, "train.save_every": 2})
    _failing_eval(monkeypatch)
    with pytest.raises(EvalFailed):
        train(recipe, target=target, tokenizer=tok)
    step2 = recipe.paths.step(2)
    assert _step_of(step2) == 2 and (step2 / "drafter" / "model.safetensors").is_file() and (step2 / "state").is_dir()


def test_a_step_checkpoint_written_before_its_evaluation_records_the_score(world, tmp_path, monkeypatch):
    """The evaluation at a step checkpoint's step runs after the checkpoint is written; its score and history are
    written into that checkpoint's trainer_state.json, as when the checkpoint was written after it. The at-end
    evaluation failing afterwards still leaves last/ at step 3."""
    from drafterkit.train.loop import train

    root, (target, tok) = world
    recipe = _recipe(root, tmp_path / "run", **{"eval.every": 2, "train.save_every": 2})
    _failing_eval(monkeypatch, at_step=2)  # the first (step 2) runs for real, the at-end one raises
    with pytest.raises(EvalFailed):
        train(recipe, target=target, tokenizer=tok)
    state = json.loads((recipe.paths.step(2) / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["best_step"] == 2 and len(state["history"]) == 1
    assert state["history"][0]["step"] == 2 and state["best_score"][0] == state["history"][0]["tau"]
    assert _step_of(recipe.paths.last) == 3 and (recipe.paths.best / "eval.json").is_file()
    assert not list(recipe.paths.step(2).glob(".trainer_state*"))
