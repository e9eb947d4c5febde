"""The training loop end to end on a tiny random target with the real SmolLM2 tokenizer."""

import argparse
import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CHAT_WORDS, random_chats, tiny_llama, training_world

from drafterkit.train.recipe import RecipeError, load_recipe, recipe_from_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target folder (vocab 49152, hidden 32, real tokenizer) and a synthetic chat JSONL."""
    root = tmp_path_factory.mktemp("train")
    with training_world(root, random_chats([12] * 40, 6)):
        yield root


def _recipe(world, out, **over):
    data = {
        "output_dir": str(out),
        "target": {"name_or_path": str(world / "target")},
        "drafter": {"kind": "draft_lm", "options": {"init": "truncated", "num_layers": 1}},
        "data": {"source": "jsonl", "path": str(world / "chat.jsonl"), "max_length": 64, "heldout_fraction": 0.1},
        "optim": {"lr": 1e-2, "schedule": "constant"},
        "train": {"max_steps": 3, "batch_size": 2, "grad_accum": 1, "log_every": 1, "resume": "never"},
        "eval": {"every": 0, "at_end": False, "num_prompts": 2, "max_new_tokens": 6, "k": 3},
    }
    return recipe_from_dict(data, [f"{k}={v}" for k, v in over.items()])


def _load(world):
    from drafterkit.assets.target import load_target

    return load_target(str(world / "target"))


def test_training_smoke_moves_drafter_keeps_target_bit_identical(world, tmp_path, capsys):
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.draft_lm import DraftLM
    from drafterkit.train.loop import train

    target, tok = _load(world)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    recipe = _recipe(world, tmp_path / "run", **{"eval.at_end": "true", "loss.weights": "{fkl: 1.0, ce: 0.5}"})
    result = train(recipe, target=target, tokenizer=tok)
    assert result.global_step == 3 and len(result.losses) == 3
    assert all(torch.isfinite(torch.tensor(result.losses)))
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), f"target tensor {k} changed"
    assert not any(p.requires_grad for p in target.parameters())
    init = DraftLM.from_target(target, 1).state_dict()
    trained = load_drafter(tmp_path / "run" / "checkpoints" / "last" / "drafter", target)
    moved = [k for k, v in trained.state_dict().items() if not torch.equal(v, init[k])]
    assert moved, "no drafter parameter changed"
    paths = recipe.paths
    assert (paths.best / "eval.json").is_file() and (paths.best / "drafter" / "model.safetensors").is_file()
    ev = json.loads((paths.best / "eval.json").read_text())
    assert ev["tau"] >= 1.0 and 0.0 <= ev["acceptance_rate"] <= 1.0 and ev["tokens_per_s"] > 0
    assert load_recipe(paths.last / "recipe.yaml") == recipe
    assert any(paths.logs.rglob("events.out.tfevents*"))
    assert not list(paths.checkpoints.glob(".tmp-*"))
    out = capsys.readouterr().out  # where the evaluable drafter is, and how to use it
    assert result.drafter == str(paths.best / "drafter")
    assert f"drafter: {paths.best / 'drafter'} (tau {ev['tau']:.2f} measured at step 3)" in out
    assert f"drafterkit eval --drafter {paths.best / 'drafter'}" in out and "drafterkit export " in out


def test_printed_export_command_runs_as_printed_for_a_medusa_head(world, tmp_path, capsys, monkeypatch):
    """The hint after training is copy-pasteable: a Medusa export writes the target's LM head from the target
    the checkpoint's recipe.yaml records, as every format reads it, so the hint needs no --target and the export
    CLI accepts the line as printed; it writes where the README's export and serve commands read
    (exports/<kind>, from where the command runs)."""
    import shlex

    from drafterkit.drafters.export.writers import run
    from drafterkit.export_args import add_arguments
    from drafterkit.train.loop import train

    target, tok = _load(world)
    recipe = _recipe(world, tmp_path / "run", **{"drafter.kind": "medusa", "drafter.options": "{num_heads: 3}"})
    train(recipe, target=target, tokenizer=tok)
    line = next(x for x in capsys.readouterr().out.splitlines() if "drafterkit export" in x)
    argv = shlex.split(line.split("drafterkit export", 1)[1].split("   (formats")[0])
    assert "--target" not in argv and argv[argv.index("--output") + 1] == "exports/medusa"
    monkeypatch.chdir(tmp_path)  # the printed --output is relative to where the command runs
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(argv)) == 0
    assert (Path(argv[argv.index("--output") + 1]) / "config.json").is_file()


def test_an_eagle3_head_on_repeated_layers_is_warned_of_and_gets_no_refused_export_hint(world, tmp_path, capsys):
    """A 2-layer target clamps EAGLE-3's default feature layers to [1, 1, 1]: the recipe's validation says so in one
    line (the layers, the exports refused, what to do), and training's closing hint suggests no export format that
    export refuses for this head (it suggested --format vllm-eagle3, then both formats were refused)."""
    import warnings

    from drafterkit.train.loop import train

    target, tok = _load(world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recipe = _recipe(world, tmp_path / "run", **{"drafter.kind": "eagle3",
                                                     "drafter.options": "{draft_vocab_size: 64}", "train.max_steps": 1})
    lines = [str(w.message) for w in caught if "feature layers" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("drafter.options.feature_layers: the EAGLE-3 head's feature layers [1, 1, 1] (the "
                               "default for a 2-layer target") and "repeat layer 1" in lines[0]
    assert "export will refuse vllm-eagle3 and sglang-eagle3" in lines[0] and "at least 4 layers" in lines[0]
    with warnings.catch_warnings(record=True) as caught:  # ids given that repeat too; a kind without feature layers not
        warnings.simplefilter("always")
        _recipe(world, tmp_path / "x", **{"drafter.kind": "eagle3", "drafter.options": "{feature_layers: [0, 1, 1]}"})
        _recipe(world, tmp_path / "x", **{"drafter.kind": "medusa", "drafter.options": "{num_heads: 3}"})
    lines = [str(w.message) for w in caught if "feature layers" in str(w.message)]
    assert len(lines) == 1 and "feature layers [0, 1, 1] (drafter.options.feature_layers) repeat layer 1" in lines[0]
    train(recipe, target=target, tokenizer=tok)
    out = capsys.readouterr().out
    assert "--format" not in out and "  export:   none: EAGLE-3 feature layer ids 1, 1, 1 repeat layer 1: " in out


def test_save_total_limit_keeps_the_newest_step_checkpoints_and_resume_still_works(world, tmp_path):
    from drafterkit.train.checkpoint import find_resume
    from drafterkit.train.loop import train

    target, tok = _load(world)
    recipe = _recipe(world, tmp_path / "run", **{"train.max_steps": 4, "train.save_every": 1,
                                                 "train.save_total_limit": 2})
    train(recipe, target=target, tokenizer=tok)
    names = sorted(p.name for p in recipe.paths.checkpoints.iterdir())
    assert names == ["last", "step-3", "step-4"]
    assert find_resume(recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume": "auto"})}))


def test_resume_equals_straight_run(world, tmp_path):
    from safetensors.torch import load_file

    from drafterkit.train.loop import train

    target, tok = _load(world)
    over = {"train.grad_accum": 2, "train.max_steps": 4, "optim.warmup_steps": 0}
    straight = train(_recipe(world, tmp_path / "a", **over), target=target, tokenizer=tok)
    first = train(_recipe(world, tmp_path / "b", **{**over, "train.max_steps": 2}), target=target, tokenizer=tok)
    half = json.loads((tmp_path / "b" / "checkpoints" / "last" / "trainer_state.json").read_text())
    second = train(_recipe(world, tmp_path / "b", **{**over, "train.resume": "auto"}), target=target, tokenizer=tok)
    assert len(second.losses) == 2 and second.global_step == 4
    got = first.losses + second.losses
    assert torch.allclose(torch.tensor(got), torch.tensor(straight.losses), atol=1e-6, rtol=0), (got, straight.losses)
    a = load_file(tmp_path / "a" / "checkpoints" / "last" / "drafter" / "model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoints" / "last" / "drafter" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    state = json.loads((tmp_path / "b" / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # the training clock (benchmarks/learning_curve.py's x axis) carries over the resume
    assert 0 < half["train_seconds"] < state["train_seconds"]


def test_unroll_alphas_match_explicit_chains():
    from drafterkit.train.losses import acceptance_probability
    from drafterkit.train.strategies.draft_lm import unroll_alphas

    lm, target = tiny_llama(3, layers=1), tiny_llama(4)
    lm.requires_grad_(True)
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 5:] = 0
    sup = torch.zeros_like(ids, dtype=torch.bool)
    sup[0, 1:6], sup[1, 2:4] = True, True
    with torch.no_grad():
        t_logits = target(input_ids=ids, attention_mask=am).logits
    k = 3
    alphas, step_mask, _ = unroll_alphas(lm, ids, am, t_logits, sup, k, temperature=0.8)
    n = 0
    for b in range(2):
        for t in range(7):
            if not sup[b, t]:
                continue
            seq = ids[b, : t + 1].tolist()
            for j in range(k):
                alive = t + j < 7 and bool(sup[b, t: t + j + 1].all())
                assert bool(step_mask[n, j]) == alive
                logits = lm(input_ids=torch.tensor([seq])).logits[0, -1]
                if alive:
                    ref = acceptance_probability(logits[None], t_logits[b, t + j][None], temperature=0.8)[0]
                    assert torch.allclose(alphas[n, j], ref, atol=1e-5)
                seq.append(int(logits.argmax()))
            n += 1
    assert n == alphas.shape[0]
    alphas.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in lm.parameters())


def test_strategy_loss_terms_and_on_policy_batch(world):
    from drafterkit.train.data import collate
    from drafterkit.train.strategies import get_strategy

    target, tok = _load(world)
    strategy = get_strategy("draft_lm")
    recipe = _recipe(world, "unused", **{"loss.weights": "{accept_len: 1.0, ce: 1.0, jsd: 0.5}",
                                         "loss.draft_steps": 2})
    drafter = strategy.build(recipe, target, tok)
    batch = collate([{"input_ids": [5, 6, 7, 8, 9, 10], "loss_mask": [0, 0, 0, 1, 1, 1]},
                     {"input_ids": [11, 12, 13, 14], "loss_mask": [0, 0, 1, 1]}], pad_token_id=0)
    strategy.check_batch(batch)
    loss, metrics = strategy.loss(drafter, target, batch, recipe)
    loss.backward()
    assert torch.isfinite(loss) and {"accept_len", "ce", "jsd", "alpha_step2"} <= metrics.keys()
    on = strategy.on_policy_batch(drafter, target, {**batch, "on_policy_seed": 1}, recipe)
    assert on["input_ids"].shape[0] == 2 and on["loss_mask"].sum() > 0
    assert on["input_ids"][0, :3].tolist() == [5, 6, 7] and on["loss_mask"][0, :3].sum() == 0  # prompt kept
    assert on["input_ids"][1, :2].tolist() == [11, 12] and on["loss_mask"][1, :2].sum() == 0
    with pytest.raises(ValueError, match="loss_mask"):
        strategy.check_batch({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})


def test_lora_checkpoint_holds_merged_weights(world, tmp_path):
    from drafterkit.drafters import load_drafter
    from drafterkit.train.strategies import get_strategy

    target, tok = _load(world)
    strategy = get_strategy("draft_lm")
    recipe = _recipe(world, tmp_path, **{"drafter.options.lora": "{r: 4}"})
    drafter = strategy.build(recipe, target, tok)
    trainable = [n for n, p in drafter.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    strategy.save(drafter, tmp_path / "d")
    loaded = load_drafter(tmp_path / "d", target)
    ids = torch.tensor([[5, 6, 7, 8]])
    drafter.eval()
    assert torch.allclose(loaded(ids), drafter(ids), atol=1e-4)


def test_wandb_missing_gives_install_hint(world, tmp_path, monkeypatch):
    import importlib.util

    from drafterkit.train.prepare import make_accelerator

    find_spec = importlib.util.find_spec  # the test extra installs wandb: hide it, as where it is missing
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match=r"pip install drafterkit\[wandb\]"):
        make_accelerator(_recipe(world, tmp_path, **{"logging.trackers": "[wandb]"}))


def test_cli_train_verb_runs_and_rejects_bad_key(world, tmp_path, capsys):
    from drafterkit.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(_recipe(world, tmp_path / "cli").to_yaml())
    assert main(["train", str(recipe), "train.max_steps=1", "logging.trackers=[]"]) == 0
    assert (tmp_path / "cli" / "checkpoints" / "last" / "drafter" / "config.json").is_file()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["global_step"] == 1
    assert main(["train", str(recipe), "optim.lrr=1"]) == 2
    assert "optim.lrr" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_recipe_on_real_target(tmp_path):
    from drafterkit.train.run import main

    over = [f"output_dir={tmp_path / 'smoke'}", "train.max_steps=1", "data.num_examples=4",
            "data.max_length=64", "drafter.options.num_layers=1", "eval.num_prompts=1",
            "eval.max_new_tokens=4", "logging.trackers=[]"]
    assert main([str(ROOT / "recipes" / "smoke.yaml"), *over]) == 0
    ev = json.loads((tmp_path / "smoke" / "checkpoints" / "best" / "eval.json").read_text())
    assert ev["tau"] >= 1.0 and ev["drafted"] > 0


def _recipe_file(world, tmp_path, out, **over) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(_recipe(world, out, **{"logging.trackers": "[]", **over}).to_yaml())
    return path


def test_a_resume_with_a_changed_recipe_says_so_and_records_it(world, tmp_path, capsys):
    """Resuming with other optimizer values used to pass silently while recipe.yaml took the new ones, and the
    model card said the recipe reruns the training. The change is printed, kept in trainer_state.json and stated
    by the model card."""
    from drafterkit.drafters.export.model_card import training_section
    from drafterkit.train.loop import train

    target, tok = _load(world)
    over = {"train.max_steps": 2, "optim.warmup_steps": 0}
    train(_recipe(world, tmp_path / "b", **over), target=target, tokenizer=tok)
    capsys.readouterr()
    train(_recipe(world, tmp_path / "b", **{**over, "train.max_steps": 3, "optim.lr": 5e-4, "train.resume": "auto"}),
          target=target, tokenizer=tok)
    out = capsys.readouterr().out
    assert "resumed with a changed recipe: optim.lr " in out and "-> 0.0005" in out and "train.max_steps 2 -> 3" in out
    last = tmp_path / "b" / "checkpoints" / "last"
    state = json.loads((last / "trainer_state.json").read_text())
    assert [c["step"] for c in state["recipe_changes"]] == [2]
    assert set(state["recipe_changes"][0]["changed"]) == {"optim.lr", "train.max_steps"}  # not train.resume
    recipe = yaml.safe_load((last / "recipe.yaml").read_text())
    card = "\n".join(training_section("draft_lm", {}, {"recipe": recipe, "state": state}, None))
    assert "Resumed at step 2 with a changed recipe: optim.lr" in card and "reruns it" not in card



def test_a_resume_with_nothing_left_to_train_leaves_last_and_the_recipe_as_they_were(world, tmp_path, capsys):
    """A checkpoint already at train.max_steps, resumed with another recipe: nothing trains, so nothing may say it
    did. checkpoints/last (its recipe.yaml, trainer_state.json, the drafter's files) and the run's recipe.yaml keep
    the recipe the steps ran with, and the run says there was nothing to train."""
    from drafterkit.train.loop import train

    target, tok = _load(world)
    over = {"train.max_steps": 2, "optim.warmup_steps": 0}
    train(_recipe(world, tmp_path / "b", **over), target=target, tokenizer=tok)
    last, root = tmp_path / "b" / "checkpoints" / "last", tmp_path / "b"
    before = {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
              and "logs" not in p.parts}
    capsys.readouterr()
    result = train(_recipe(world, tmp_path / "b", **{**over, "optim.lr": 5e-4, "train.resume": "auto"}),
                   target=target, tokenizer=tok)
    out = capsys.readouterr().out
    assert "nothing to train: the checkpoint is at step 2 and train.max_steps is 2" in out
    assert result.global_step == 2 and (last / "drafter").is_dir()
    after = {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
             and "logs" not in p.parts}
    assert after == before

def test_sigint_saves_last_and_resume_auto_takes_newest_complete_checkpoint(world, tmp_path, capsys, monkeypatch):
    from drafterkit.cli import main
    from drafterkit.train import loop

    out, ck = tmp_path / "run", tmp_path / "run" / "checkpoints"
    recipe = _recipe_file(world, tmp_path, out, **{"train.max_steps": 4, "train.save_every": 1})
    one_step = loop.train_step

    def step_then_ctrl_c(ctx, data, state):
        metrics = one_step(ctx, data, state)
        if state.global_step == 1:  # inside the 2nd optimizer step: it must still finish
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(loop, "train_step", step_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs in a background job
    assert main(["train", str(recipe)]) == 130
    printed = capsys.readouterr().out
    assert json.loads(printed.strip().splitlines()[-1])["stopped"] == "interrupted"
    assert "interrupted by SIGINT after step 2 of 4" in printed and "train.resume=auto" in printed
    assert json.loads((ck / "last" / "trainer_state.json").read_text())["global_step"] == 2
    assert signal.getsignal(signal.SIGINT) == before  # handlers restored
    monkeypatch.setattr(loop, "train_step", one_step)
    # As after kill -9 mid-save: no last/, step-1 and step-2 complete, a half-written temp folder.
    shutil.rmtree(ck / "last")
    shutil.copytree(ck / "step-1", ck / ".tmp-last")
    (ck / ".tmp-last" / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    assert main(["train", str(recipe), "train.resume=auto"]) == 0
    printed = capsys.readouterr().out
    assert f"resumed from {ck / 'step-2'} at step 2" in printed
    summary = json.loads(printed.strip().splitlines()[-1])
    assert summary["global_step"] == 4 and summary["drafter"] == str(ck / "last" / "drafter")
    assert f"drafter: {ck / 'last' / 'drafter'} (step 4; no evaluation during training" in printed
    assert json.loads((ck / "last" / "trainer_state.json").read_text())["global_step"] == 4


def test_rerun_into_used_output_dir_is_refused_before_the_target_loads_unless_overwrite(world, tmp_path):
    from drafterkit.train.loop import train

    target, tok = _load(world)
    out = tmp_path / "run"
    train(_recipe(world, out, **{"train.max_steps": 1, "eval.at_end": "true"}), target=target, tokenizer=tok)
    assert (out / "checkpoints" / "best" / "eval.json").is_file()
    no_target = {"target.name_or_path": str(tmp_path / "no-such-target")}  # loading it would fail differently
    with pytest.raises(RecipeError) as err:
        train(_recipe(world, out, **{"train.max_steps": 1, **no_target}))
    msg = str(err.value)
    assert str(out / "checkpoints") in msg and "best, last" in msg
    assert "train.resume=auto" in msg and "new output_dir" in msg and "train.overwrite=true" in msg
    again = train(_recipe(world, out, **{"train.max_steps": 2, "train.overwrite": "true"}), target=target,
                  tokenizer=tok)
    assert again.global_step == 2 and again.drafter == str(out / "checkpoints" / "last" / "drafter")
    assert not (out / "checkpoints" / "best").exists() and not (out / "eval").exists()  # the old run is gone


def test_data_path_is_read_for_sharegpt_source_and_a_missing_one_fails_first(world, tmp_path, monkeypatch):
    from drafterkit.train.loop import train

    def no_asset(name):
        raise AssertionError(f"fetched the pinned asset {name!r} although data.path is set")

    monkeypatch.setattr("drafterkit.assets.pinned.fetch", no_asset)
    rnd = random.Random(1)
    records = [{"id": f"s{i}", "conversations": [{"from": "human", "value": " ".join(rnd.choices(CHAT_WORDS, k=5))},
                                                  {"from": "gpt", "value": " ".join(rnd.choices(CHAT_WORDS, k=9))}]}
               for i in range(40)]
    sharegpt = tmp_path / "mine.json"
    sharegpt.write_text(json.dumps(records))
    over = {"data.source": "sharegpt", "data.path": str(sharegpt), "train.max_steps": 1}
    target, tok = _load(world)
    result = train(_recipe(world, tmp_path / "a", **over, **{"eval.at_end": "true"}), target=target, tokenizer=tok)
    assert result.global_step == 1 and result.evals  # eval prompts: held-out conversations of the same file
    missing = {**over, "data.path": str(tmp_path / "nope.json"), "target.name_or_path": str(tmp_path / "none")}
    with pytest.raises(RecipeError, match=r"data\.path: .*nope\.json.* is not a file"):
        train(_recipe(world, tmp_path / "b", **missing))


def test_drafter_option_unfit_for_target_is_a_clean_error_before_data(world, tmp_path, capsys, monkeypatch):
    from drafterkit.cli import main
    from drafterkit.train import prepare

    monkeypatch.setattr(prepare, "load_data", lambda *a: pytest.fail("data loaded before the drafter was built"))
    recipe = _recipe_file(world, tmp_path, tmp_path / "run")
    assert main(["train", str(recipe), "drafter.options.num_layers=99"]) == 2
    err = capsys.readouterr().err
    # refused when the recipe is validated (train/options.py): the recipe named, then one line naming the
    # option, the target's limit and the fix
    assert err.splitlines() == [
        f"drafterkit train: error: {recipe}: invalid recipe:",
        "drafter.options.num_layers: 99 is not in [1, 1] for this llama target of 2 layers (init=truncated copies "
        "its first num_layers layers, and the draft must be smaller than the target: 2 would copy it whole); "
        "set drafter.options.num_layers to at most 1"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("entry", ["drafterkit", "python -m drafterkit.train"])
def test_options_may_come_after_positional_overrides(world, tmp_path, capsys, entry):
    from drafterkit.cli import main as drafterkit
    from drafterkit.train.run import main as python_m_train

    recipe = _recipe_file(world, tmp_path, tmp_path / "run")
    argv = [str(recipe), "optim.lr=2e-3", "--print-recipe", f"output_dir={tmp_path / 'x'}"]
    assert (drafterkit(["train", *argv]) if entry == "drafterkit" else python_m_train(argv)) == 0
    printed = capsys.readouterr().out
    assert f"output_dir: {tmp_path / 'x'}" in printed and "lr: 0.002" in printed
    assert not (tmp_path / "x").exists()  # printed, not trained


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_budget_schedule_is_transformers_shape_by_steps_and_follows_the_clock(kind):
    """Without max_minutes the factor equals transformers' get_scheduler at every step; with it, the
    progress is the larger of the step and wall-clock fractions (a run stopped by time ends annealed)."""
    from transformers import get_scheduler

    from drafterkit.train.step import BudgetSchedule

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_scheduler(kind, opt, num_warmup_steps=5, num_training_steps=40)
    ours = BudgetSchedule(kind, 5, 40)
    for step in range(41):
        assert ours(step) == pytest.approx(ref.lr_lambdas[0](step), abs=1e-12), step
    two = BudgetSchedule(kind, 5, 40, world=2)  # accelerate steps a prepared scheduler once per process
    assert two(20) == pytest.approx(ours(10))
    timed = BudgetSchedule(kind, 5, 1000, max_minutes=10.0)
    timed.elapsed_s = 300.0  # half the budget gone at step 10 of 1000
    expected = {"cosine": 0.5, "linear": 0.5, "constant": 1.0}[kind]
    assert timed(10) == pytest.approx(expected, abs=1e-12)
    timed.elapsed_s = 700.0  # past the budget: the end of the schedule
    assert timed(10) == pytest.approx(0.0 if kind != "constant" else 1.0, abs=1e-12)
    assert BudgetSchedule(kind, 5, 1000, max_minutes=10.0)(10) == pytest.approx(ours.__class__(kind, 5, 1000)(10))


def test_max_minutes_stops_the_run_and_ends_the_cosine_schedule(world, tmp_path):
    """A time-bound run (max_steps far away) stops on the clock with the learning rate annealed to ~0,
    and saves last/."""
    import time

    from drafterkit.train.loop import train

    recipe = _recipe(world, tmp_path / "timed", **{"optim.schedule": "cosine", "optim.warmup_steps": 0,
                                                   "train.max_steps": 100000, "train.max_minutes": 0.05})
    t0 = time.perf_counter()
    res = train(recipe)
    assert res.stopped == "max_minutes" and 1 < res.global_step < 100000
    assert time.perf_counter() - t0 < 60
    lrs = []

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for ev in sorted((tmp_path / "timed").rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(ev))
        acc.Reload()
        if "train/lr" in acc.Tags()["scalars"]:
            lrs = [e.value for e in acc.Scalars("train/lr")]
    # max_steps is 100000 steps away, so only the clock can anneal the schedule: the logged learning rate
    # starts at ~lr and falls step after step (how far depends on when the last step lands in the budget,
    # which a busy machine moves; the schedule's values at given times are tested exactly above)
    # (without the clock the cosine over 100000 steps would stay within 1e-6 of lr for these few steps;
    # a busy machine may log only two steps, so the fall is asked to be clear, not to reach a given depth)
    assert len(lrs) >= 2 and lrs[0] > 0.5e-2 and lrs[-1] < 0.9 * lrs[0]
    assert all(b <= a for a, b in zip(lrs, lrs[1:]))
    assert (tmp_path / "timed" / "checkpoints" / "last").is_dir()


@pytest.mark.multiprocess
def test_two_cpu_processes_train_as_one_run_and_stop_together_on_the_clock(world, tmp_path):
    """``torchrun --nproc_per_node 2`` on CPU is one data-parallel run (accelerate MULTI_CPU over gloo),
    not two independent ones racing on the same folder; a max_minutes stop is agreed by both processes."""
    from sharded_runs import launch

    path = _recipe_file(world, tmp_path, tmp_path / "mp", **{"optim.schedule": "cosine", "train.max_steps": 100000,
                                                              "train.max_minutes": 0.1})
    proc = launch("-m", "drafterkit.train", str(path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(line.startswith('{"output_dir"') for line in proc.stdout.splitlines()) == 1  # one summary line
    state = json.loads((tmp_path / "mp" / "checkpoints" / "last" / "trainer_state.json").read_text())
    # two processes x batch_size 2 per optimizer step: the data position advances 4 examples per step
    per_epoch = 36 // 4  # 40 examples, 10% held out
    assert state["global_step"] > 1
    assert state["epoch"] * per_epoch + state["batch_in_epoch"] == state["global_step"]


def test_the_bar_counts_toward_the_bound_that_stops_the_run(capsys):
    """With train.max_minutes either bound may end the run: the bar shows the share done toward the one reached
    first at the pace so far (the clock on a CPU with the recipe's max_steps; max_steps in a short run), names it,
    and ends at 100% naming the bound that ended it; a 20-step run shows no 28-minute countdown."""
    import time
    from types import SimpleNamespace

    from drafterkit.train.loop import SHARE_TOTAL, advance, finish, progress_bar, run_share

    assert run_share(SimpleNamespace(max_minutes=28, max_steps=20), 5, 6.0) == (0.25, "max_steps")
    assert run_share(SimpleNamespace(max_minutes=14.5, max_steps=2000), 7, 87.0) == (0.1, "max_minutes")
    assert run_share(SimpleNamespace(max_minutes=1, max_steps=20), 3, 600.0) == (1.0, "max_minutes")
    timed = SimpleNamespace(max_minutes=14.5, max_steps=2000)
    start = time.perf_counter() - 60  # the quickstart's budget counts from before data preparation
    bar = progress_bar(timed, 0, start, disable=False)
    assert bar.total == SHARE_TOTAL and 68 <= bar.n <= 72  # 60 s of 870
    advance(bar, timed, 7, start - 30, 2.5)  # 7 of 2000 steps in 90 s: the clock comes first
    assert 102 <= bar.n <= 108 and bar.postfix == "step 7/2000, loss 2.5000, ends at 14.5 min"
    advance(bar, timed, 8, start - 3600, 2.4)  # past the budget: the bar stops at its total
    assert bar.n == SHARE_TOTAL
    bar.close()
    err = capsys.readouterr().err
    assert "train (2000 steps or 14.5 min, whichever comes first)" in err
    steps = SimpleNamespace(max_minutes=None, max_steps=20)
    bar = progress_bar(steps, 3, time.perf_counter(), disable=False)
    advance(bar, steps, 4, time.perf_counter(), 1.0)
    assert (bar.total, bar.n, bar.unit) == (20, 4, "it")
    bar.close()
    # a 20-step run with the recipe's 28 min budget: the bar counts toward step 20, not the budget
    short = SimpleNamespace(max_minutes=28, max_steps=20)
    start = time.perf_counter()
    bar = progress_bar(short, 0, start, disable=False)
    advance(bar, short, 5, start - 6, 2.0)
    assert bar.n == 250 and bar.postfix == "step 5/20, loss 2.0000, ends at step 20"
    advance(bar, short, 20, start - 24, 1.5)
    assert bar.n == SHARE_TOTAL
    finish(bar, short, 20, "max_steps")  # ending on max_steps: 100% of the run, not a jump to the budget
    assert bar.n == bar.total == SHARE_TOTAL and bar.postfix == "step 20/20, done: max_steps 20 reached"
    err = capsys.readouterr().err
    assert "100%" in err and "28:0" not in err and "27:" not in err
    bar = progress_bar(short, 0, time.perf_counter() - 30, disable=False)
    finish(bar, short, 3, "interrupted")  # a signal: the bar stays where the run stopped and says why
    assert bar.n < bar.total and "interrupted" in bar.postfix


def test_a_run_names_its_training_engine_and_precision_once(world, tmp_path, capsys, monkeypatch):
    """One line at the start names the engine, the device and the precision; where ``accelerate launch`` passed its
    default ``--mixed_precision no`` (the warning it prints), the line says the recipe's setting applies."""
    from drafterkit.train.loop import train

    # as accelerate launch --mixed_precision bf16 sets it (its default 'no' the same way); accelerate's state is one
    # per process, so the recipe keeps the precision the other tests of this module run with
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    train(_recipe(world, tmp_path / "r", **{"train.max_steps": 1, "train.mixed_precision": "no"}))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("training engine:")]
    assert lines == ["training engine: a single process (no data parallelism) on cpu, fp32 (no autocast) "
                     "(train.mixed_precision); accelerate launch's --mixed_precision 'bf16' does not apply: the "
                     "recipe's train.mixed_precision sets it"]


def test_an_evaluation_past_the_budget_leaves_max_steps_as_the_stop_reason(world, tmp_path):
    """max_steps ends training; the at-end evaluation that follows may run past train.max_minutes (here the budget
    is spent before the first step ends), and the run still reports the bound that stopped training."""
    from drafterkit.train.loop import train

    res = train(_recipe(world, tmp_path / "r", **{"train.max_steps": 1, "train.max_minutes": 1e-6,
                                                    "eval.at_end": "true"}))
    assert res.global_step == 1 and res.stopped == "max_steps" and len(res.evals) == 1


def test_a_resumed_time_bound_run_continues_its_budget_and_schedule(world, tmp_path):
    """max_minutes counts every run of the output_dir (the checkpoint's train_seconds): "rerun the same command"
    after Ctrl-C finishes the interrupted run, on the learning rate where it stopped. It used to start a fresh
    budget, and the cosine schedule jumped back up (1.18e-3 -> 1.50e-3 across a resume)."""
    from drafterkit.train.loop import train
    from drafterkit.train.step import BudgetSchedule

    target, tok = _load(world)
    over = {"optim.schedule": "cosine", "optim.warmup_steps": 0, "train.max_steps": 100000}
    first = train(_recipe(world, tmp_path / "r", **{**over, "train.max_steps": 3}), target=target, tokenizer=tok)
    spent = json.loads((tmp_path / "r" / "checkpoints" / "last" / "trainer_state.json").read_text())["train_seconds"]
    assert first.global_step == 3 and spent > 0
    # a budget the first run already used up: nothing left, the run stops where it was
    done = train(_recipe(world, tmp_path / "r", **over, **{"train.resume": "auto", "train.max_minutes": spent / 120}),
                 target=target, tokenizer=tok)
    assert done.stopped == "max_minutes" and done.global_step == 3 and done.losses == []
    # a budget with time left: the schedule's clock starts from the seconds already trained, not from 0
    seen = []
    real_progress = BudgetSchedule.progress
    BudgetSchedule.progress = lambda self, step: seen.append(self.elapsed_s) or real_progress(self, step)
    try:
        more = train(_recipe(world, tmp_path / "r", **over, **{"train.resume": "auto",
                                                               "train.max_minutes": (spent + 3) / 60}),
                     target=target, tokenizer=tok)  # 3 s past what the first run spent, however slow the machine
    finally:
        BudgetSchedule.progress = real_progress
    assert more.stopped == "max_minutes" and more.global_step > 3
    # every learning rate of the resumed run counts the first run's seconds (0.0: the scheduler's own call when it
    # is built, before the checkpoint's state replaces it)
    assert [e for e in seen if e > 0] and min(e for e in seen if e > 0) >= spent


def test_resuming_a_drafter_of_another_shape_is_a_recipe_error(world, tmp_path):
    """A rerun whose drafter options changed since the checkpoint was saved: one RecipeError naming the way out,
    not torch's load_state_dict traceback."""
    from drafterkit.train.loop import train

    target, tok = _load(world)
    medusa = {"drafter.kind": "medusa", "drafter.options": "{num_heads: 3}"}
    train(_recipe(world, tmp_path / "run", **{"train.max_steps": 1, **medusa}), target=target, tokenizer=tok)
    grown = _recipe(world, tmp_path / "run", **{"train.max_steps": 2, "train.resume": "auto", **medusa,
                                                "drafter.options": "{num_heads: 4}"})
    with pytest.raises(RecipeError,
                       match="cannot resume from .*does not fit the one this recipe builds.*new output_dir"):
        train(grown, target=target, tokenizer=tok)


def test_resuming_a_checkpoint_of_another_kind_names_both_kinds_before_anything_loads(world, tmp_path):
    """A recipe of one kind rerun into a run of another kind: one RecipeError naming the checkpoint's kind, the
    recipe's and the fixes, from the checks that load no model (``preflight``), not torch's size mismatch."""
    from drafterkit.train.loop import train
    from drafterkit.train.prepare import preflight

    target, tok = _load(world)
    train(_recipe(world, tmp_path / "run", **{"train.max_steps": 1}), target=target, tokenizer=tok)
    medusa = _recipe(world, tmp_path / "run", **{"train.resume": "auto", "drafter.kind": "medusa",
                                                 "drafter.options": "{num_heads: 3}"})  # eval.k 3 fits
    says = (rf"cannot resume {tmp_path / 'run' / 'checkpoints' / 'last'}: it is a draft_lm checkpoint and this "
            r"recipe trains drafter.kind=medusa; .*output_dir=.*drafter.kind=draft_lm")
    with pytest.raises(RecipeError, match=says) as exc:
        preflight(medusa)
    assert "\n" not in str(exc.value) and "size mismatch" not in str(exc.value)
    with pytest.raises(RecipeError, match=says):
        train(medusa, target=target, tokenizer=tok)


def test_resuming_another_runs_checkpoint_starts_best_afresh_and_another_target_is_refused(world, tmp_path, capsys):
    """``train.resume=<run a>/checkpoints/last`` into another output_dir keeps a's weights and step but not a's best
    (its score measured a's evaluations: inherited, the new run would never write its own best/ and would report
    a's score); a resume into a's own output_dir keeps it. A checkpoint trained for another target is refused
    before anything loads, as the target mismatch checks refuse it."""
    from drafterkit.train.loop import train
    from drafterkit.train.prepare import preflight

    target, tok = _load(world)
    a = train(_recipe(world, tmp_path / "a", **{"train.max_steps": 2, "eval.at_end": "true"}), target=target,
              tokenizer=tok)
    assert a.best_score is not None
    last = tmp_path / "a" / "checkpoints" / "last"
    capsys.readouterr()
    b = train(_recipe(world, tmp_path / "b", **{"train.max_steps": 3, "train.resume": str(last)}), target=target,
              tokenizer=tok)
    out = capsys.readouterr().out
    assert b.global_step == 3 and len(b.losses) == 1 and b.best_score is None, b
    assert "a checkpoint of another output_dir" in out and "best tracking starts afresh" in out
    assert json.loads((tmp_path / "b" / "checkpoints" / "last" / "trainer_state.json").read_text())["best_step"] is None
    same = train(_recipe(world, tmp_path / "a", **{"train.max_steps": 3, "train.resume": "auto"}), target=target,
                 tokenizer=tok)
    assert same.best_score == a.best_score and "another output_dir" not in capsys.readouterr().out
    other = tmp_path / "other"  # another target: SmolLM2's tokenizer too, other weights
    shutil.copytree(world / "target", other)
    tiny_llama(5, vocab_size=target.config.vocab_size, hidden_size=32).save_pretrained(other)
    shutil.copy(world / "target" / "config.json", other / "config.json")
    moved = _recipe(world, tmp_path / "c", **{"train.resume": str(last), "target.name_or_path": str(other)})
    with pytest.raises(RecipeError, match=rf"cannot resume {last}: it was trained for target {world / 'target'} "
                                          rf"\(its recipe.yaml\), not this recipe's {other}.*target.name_or_path="):
        preflight(moved)


@pytest.mark.multiprocess
def test_each_process_prints_drafterkit_warnings_as_one_line_and_no_deepspeed_guess(world, tmp_path):
    """``python -m drafterkit.train``, what torchrun and accelerate launch start in each process, prints
    drafterkit's warnings as ``drafterkit VERB`` does (one ``drafterkit: warning:`` line, not Python's
    ``path:line: UserWarning`` and a source line); neither it nor ``drafterkit export`` prints DeepSpeed's
    "Setting accelerator to CPU" guess (accelerate imports DeepSpeed where it is installed, as here, whatever the
    run) when no DeepSpeed engine runs."""
    import subprocess
    import sys

    recipe = _recipe(world, tmp_path / "run", **{"train.max_steps": 1, "data.num_examples": 500}).save(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    out = subprocess.run([sys.executable, "-m", "drafterkit.train", str(recipe)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "\ndrafterkit: warning: " in out.stderr and "fewer than the 500 asked" in out.stderr, out.stderr
    assert "UserWarning" not in out.stderr and "warnings.warn(" not in out.stderr, out.stderr
    export = subprocess.run([sys.executable, "-m", "drafterkit.cli", "export", str(tmp_path / "run"), "--format",
                             "hf-assistant", "--output", str(tmp_path / "hf")], capture_output=True, text=True,
                            cwd=ROOT, timeout=600, env=env)
    assert export.returncode == 0, export.stderr
    for printed in (out, export):
        assert "Setting accelerator" not in printed.stdout + printed.stderr


def test_a_stop_signal_does_not_wait_for_the_evaluation_due_at_that_step(world, tmp_path, monkeypatch):
    from drafterkit.train import loop

    target, tok = _load(world)
    one_step = loop.train_step

    def step_then_ctrl_c(ctx, data, state):
        metrics = one_step(ctx, data, state)
        if state.global_step == 1:  # inside the 2nd optimizer step, whose evaluation (eval.every 2) is then due
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(loop, "train_step", step_then_ctrl_c)
    recipe = _recipe(world, tmp_path / "run", **{"train.max_steps": 4, "eval.every": 2})
    result = loop.train(recipe, target=target, tokenizer=tok)
    assert result.stopped == "interrupted" and result.global_step == 2 and result.evals == []
    assert not (tmp_path / "run" / "eval" / "step-2.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "last" / "drafter").is_dir()
