"""The update does not depend on how an optimizer step's examples are split, through the real CLI.

8 sequences whose assistant replies hold 1 to ~40 supervised tokens are trained on as 8 x 1, 2 x 4 and
1 x 8 (batch x accumulation), and as one process or two gloo processes: the parameters after two
optimizer steps agree to float rounding, and the logged loss is the mean over every supervised token of
the step (not the mean of micro-batch means).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import random_chats, training_world
from sharded_runs import launch

KINDS = {
    "draft_lm": "{init: truncated, num_layers: 1}",
    "eagle3": "{draft_vocab_size: 512, ttt_steps: 3}",
    "medusa": "{num_heads: 3, train_vocab_size: 512}",
    "eagle": "{train_vocab_size: 512}",
    "dflash": "{draft_vocab_size: 512, block_size: 4, num_anchors: 64}",
    "dspark": "{draft_vocab_size: 512, block_size: 4, num_anchors: 64, markov_rank: 8}",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target (vocab 49152, real tokenizer) and 8 training chats with very different reply lengths."""
    root = tmp_path_factory.mktemp("invariance")
    with training_world(root, random_chats([1, 40, 3, 25, 2, 12, 1, 30], 5)):
        yield root


def _recipe_file(world: Path, tmp: Path, kind: str) -> Path:
    from drafterkit.train.recipe import recipe_from_dict

    data = {
        "output_dir": str(tmp / "unused"),
        "target": {"name_or_path": str(world / "target")},
        "drafter": {"kind": kind},
        "data": {"source": "jsonl", "path": str(world / "chat.jsonl"), "max_length": 96, "heldout_fraction": 0.0},
        # eps = 1 makes AdamW's step proportional to the gradient, so a mis-scaled gradient shows in the
        # parameters (with eps = 1e-8 a first Adam step is ~lr * sign(g), blind to the gradient's scale)
        "optim": {"lr": 1e-2, "schedule": "constant", "eps": 1.0, "grad_clip": None},
        "train": {"max_steps": 2, "batch_size": 8, "grad_accum": 1, "log_every": 1, "resume": "never"},
        "eval": {"every": 0, "at_end": False, "k": 3},
        "logging": {"trackers": []},
    }
    recipe = recipe_from_dict(data, [f"drafter.options={KINDS[kind]}"])
    path = tmp / f"{kind}.yaml"
    path.write_text(recipe.to_yaml())
    return path


def _train_cli(recipe: Path, out: Path, batch: int, accum: int, capsys) -> dict:
    from drafterkit.cli import main

    code = main(["train", str(recipe), f"output_dir={out}", f"train.batch_size={batch}", f"train.grad_accum={accum}"])
    assert code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _params(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "checkpoints" / "last" / "drafter" / "model.safetensors"))


def _assert_same_update(a: dict, b: dict, init: dict, what: str) -> None:
    update = max(float((a[k].float() - init[k].float()).abs().max()) for k in a)
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert update > 1e-4, f"{what}: training did not move the drafter"
    assert diff <= 1e-3 * update, f"{what}: parameters differ by {diff:.3g} for an update of {update:.3g}"


def _initial_params(world: Path, recipe: Path) -> dict[str, torch.Tensor]:
    """The drafter as the strategy builds it before any step (seeded as in training)."""
    from accelerate.utils import set_seed

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.strategies import get_strategy

    r = load_recipe(recipe)
    target, tok = load_target(str(world / "target"))
    set_seed(r.train.seed)
    drafter = get_strategy(r.drafter.kind).build(r, target, tok)
    return {k: v.detach().clone() for k, v in drafter.state_dict().items()}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_batch_times_accumulation_splits_give_one_update(world, tmp_path, capsys, kind):
    recipe = _recipe_file(world, tmp_path, kind)
    splits = [(2, 4), (1, 8)] if kind in ("draft_lm", "eagle3") else [(1, 8)]  # the chained head kinds share code
    runs = {(b, g): _train_cli(recipe, tmp_path / f"b{b}g{g}", b, g, capsys) for b, g in [(8, 1)] + splits}
    ref = _params(tmp_path / "b8g1")
    init = _initial_params(world, recipe)
    saved = {k: init[k] for k in ref}
    for b, g in splits:
        _assert_same_update(_params(tmp_path / f"b{b}g{g}"), ref, saved, f"{kind} {b} x {g} vs 8 x 1")
        assert runs[(b, g)]["final_loss"] == pytest.approx(runs[(8, 1)]["final_loss"], rel=1e-4)


def test_logged_loss_is_the_mean_over_every_supervised_token_of_the_step(world, tmp_path, capsys):
    """One step of 2 x 4 logs sum(per-token losses) / (supervised tokens), computed here per example."""
    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe_data import load_data
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.data import collate
    from drafterkit.train.strategies import get_strategy

    recipe = _recipe_file(world, tmp_path, "draft_lm")
    out = tmp_path / "one"
    from drafterkit.cli import main

    assert main(["train", str(recipe), f"output_dir={out}", "train.max_steps=1", "train.batch_size=2",
                 "train.grad_accum=4"]) == 0
    logged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["final_loss"]
    r = load_recipe(recipe)
    target, tok = load_target(str(world / "target"))
    from accelerate.utils import set_seed

    set_seed(r.train.seed)
    strategy = get_strategy("draft_lm")
    drafter = strategy.build(r, target, tok)
    ds = load_data(r, target, tok)
    total, tokens, means = 0.0, 0.0, []
    with torch.no_grad():
        for i in range(len(ds)):
            loss, m = strategy.loss(drafter, target, collate([ds[i]], pad_token_id=0), r)
            total, tokens = total + float(loss) * m["tokens"], tokens + m["tokens"]
            means.append(float(loss))
    assert len(ds) == 8 and min(ds[i]["loss_mask"].count(1) if isinstance(ds[i]["loss_mask"], list)
                                 else int(sum(ds[i]["loss_mask"])) for i in range(8)) <= 3
    assert logged == pytest.approx(total / tokens, rel=1e-5)
    assert abs(logged - sum(means) / len(means)) > 1e-3  # the two means differ on this data


@pytest.mark.multiprocess
def test_two_gloo_processes_give_the_one_process_update(world, tmp_path, capsys):
    recipe = _recipe_file(world, tmp_path, "draft_lm")
    one = _train_cli(recipe, tmp_path / "one", 8, 1, capsys)
    proc = launch("-m", "drafterkit.train", str(recipe), f"output_dir={tmp_path / 'two'}", "train.batch_size=2",
                  "train.grad_accum=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')][-1])
    init = _initial_params(world, recipe)
    ref = _params(tmp_path / "one")
    _assert_same_update(_params(tmp_path / "two"), ref, {k: init[k] for k in ref}, "2 processes x 2 x 2 vs 1 x 8 x 1")
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-4)
