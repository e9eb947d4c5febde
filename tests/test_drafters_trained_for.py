"""A feature-level head used with another target than the one it was trained for: every command that takes a target
says so in one warning line naming both and the fix (a fine-tuned sibling is a legitimate use), and refuses a target
whose vocabulary maps tokens to other ids. Targets are identified robustly (assets.target.same_target). Through the
real CLI on tiny saved targets."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch
from families import build_family, save_family

from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS, default_target_dir
from drafterkit.assets.target import same_target
from drafterkit.cli import main as cli
from drafterkit.drafters import load_drafter
from drafterkit.drafters.base import DrafterLoadError
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.target.trained_for import shapes_match, trained_for_problem, trained_target
from drafterkit.train.recipe import recipe_from_dict


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """``a`` (the target trained for), ``a-copy`` (a copy of its folder), ``b`` (same family and shapes, other
    weights: a fine-tune's stand-in), ``c`` (``b`` with two token ids swapped in its tokenizer), ``a-swapped``
    (``a``'s weights with ``c``'s tokenizer), ``wide`` (another hidden size), ``run`` (a training run whose
    checkpoints/best holds an EAGLE-3 head for ``a`` and its recipe.yaml), ``run-b`` (the same head, its recipe
    naming ``b``), ``lm-run`` (a draft LM trained for ``b``), a prompt file."""
    root = tmp_path_factory.mktemp("trained-for")
    model, _ = save_family("llama3", root / "a")
    save_family("llama3", root / "b", seed=1)
    shutil.copytree(root / "a", root / "a-copy")
    shutil.copytree(root / "b", root / "c")
    tok = json.loads((root / "c" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    x, y = [t for t, i in vocab.items() if i in (10, 11)]
    vocab[x], vocab[y] = vocab[y], vocab[x]
    (root / "c" / "tokenizer.json").write_text(json.dumps(tok))
    shutil.copytree(root / "a", root / "a-swapped")  # a's weights, c's swapped token ids
    shutil.copy(root / "c" / "tokenizer.json", root / "a-swapped" / "tokenizer.json")
    save_family("llama3", root / "wide", hidden_size=32)  # another hidden size: the head cannot read it
    save_family("llama3", root / "padded", vocab_size=384)  # a's tokenizer, its LM head padded to more rows
    recipe = recipe_from_dict({"output_dir": str(root / "run"), "target": {"name_or_path": str(root / "a")},
                               "drafter": {"kind": "eagle3", "options": {"draft_vocab_size": 64}}})
    torch.manual_seed(0)
    head = Eagle3Drafter(Eagle3Config.from_target(model, draft_vocab_size=64), target=model)
    head.set_draft_vocab(torch.arange(64), target=model)
    best = root / "run" / "checkpoints" / "best"
    head.save_pretrained(best / "drafter")
    recipe.save(best)
    lm_best = root / "lm-run" / "checkpoints" / "best"  # a draft LM trained for b (reads token ids only)
    DraftLM.from_target(build_family("llama3", seed=1)[0], num_layers=1).save_pretrained(lm_best / "drafter")
    recipe_from_dict({"output_dir": str(root / "lm-run"), "target": {"name_or_path": str(root / "b")},
                      "drafter": {"kind": "draft_lm", "options": {"num_layers": 1}}}).save(lm_best)
    shutil.copytree(root / "run", root / "run-b")
    recipe_b = root / "run-b" / "checkpoints" / "best" / "recipe.yaml"
    recipe_b.write_text(recipe_b.read_text().replace(str(root / "a"), str(root / "b")))
    (root / "p.jsonl").write_text(json.dumps({"prompt": "hello world"}) + "\n")
    return root


def test_targets_are_the_same_however_they_are_named(world, tmp_path, monkeypatch):
    a = world / "a"
    assert same_target(str(a), str(a) + "/")
    monkeypatch.chdir(world)
    assert same_target("./a", str(a)) and same_target("a-copy", str(a))  # relative; a copy of the folder
    os.symlink(a, tmp_path / "link")
    assert same_target(str(tmp_path / "link"), str(a))
    assert not same_target(str(world / "b"), str(a))  # same config and shapes, other weights
    assert not same_target(str(world / "missing"), str(a))
    assert same_target(DEFAULT_TARGET_ALIAS, str(default_target_dir()))  # the registry name and its folder
    assert same_target("Org/Model", "org/model") and not same_target("org/model", "org/other")
    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert same_target(str(snapshot), "org/model") and not same_target(str(snapshot), "org/other")


def test_the_recorded_target_and_what_is_said(world):
    run = world / "run"
    assert trained_target(run / "checkpoints" / "best" / "drafter") == str(world / "a")
    assert trained_for_problem(run, str(world / "a")) is None
    assert trained_for_problem(run, str(world / "a-copy")) is None
    line = trained_for_problem(run, str(world / "b"), label="--drafter R")
    assert line.startswith(f"--drafter R: this eagle3 drafter was trained for target {world / 'a'} (its recipe.yaml), "
                           f"not {world / 'b'}") and "same vocabulary" in line
    assert f"fine-tune of {world / 'a'}" in line and f"pass --target {world / 'a'}" in line and "\n" not in line
    bare = world / "bare"
    shutil.copytree(run / "checkpoints" / "best" / "drafter", bare)
    assert trained_for_problem(bare, str(world / "b")) is None  # no record: nothing to compare


def test_a_target_of_another_architecture_is_not_called_a_fine_tune(world, tmp_path):
    """Same shapes and vocabulary but another model_type (Mistral for a head trained on Llama): the line says the
    drafter was trained for another architecture, naming both, instead of "right for a fine-tune of" it."""
    save_family("mistral", tmp_path / "m")
    line = trained_for_problem(world / "run", str(tmp_path / "m"), label="--drafter R")
    assert line == (f"--drafter R: this eagle3 drafter was trained for target {world / 'a'} (its recipe.yaml, "
                    f"model_type llama), not {tmp_path / 'm'} (model_type mistral): a different architecture, whose "
                    f"features the drafter was not fitted to; pass --target {world / 'a'}, or train a drafter for "
                    f"{tmp_path / 'm'}")
    assert "fine-tune" in trained_for_problem(world / "run", str(world / "b"))  # the same architecture: as before


def _eval(world, target: str) -> list[str]:
    return ["eval", "--target", target, "--drafter", str(world / "run"), "--benchmark", str(world / "p.jsonl"),
            "--num-prompts", "1", "--max-new-tokens", "4", "--baselines", "engine", "--no-progress", "--device", "cpu",
            "--output", str(world / "out.json")]


def _trained_for_lines(caught) -> list[str]:
    return [str(w.message) for w in caught if "was trained for target" in str(w.message)]


def test_eval_warns_for_another_target_and_not_for_the_same_one(world, monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(_eval(world, str(world / "b"))) == 0
    lines = _trained_for_lines(caught)
    assert len(lines) == 1 and lines[0].startswith(f"--drafter {world / 'run'}: this eagle3 drafter was trained "
                                                   f"for target {world / 'a'}")
    monkeypatch.chdir(world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(_eval(world, "./a-copy")) == 0
    assert _trained_for_lines(caught) == []


def test_a_target_of_another_vocabulary_is_refused_by_eval_and_tune(world, capsys):
    capsys.readouterr()
    assert cli(_eval(world, str(world / "c"))) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drafterkit eval: error: ") and len(err.splitlines()) == 1
    assert f"trained for target {world / 'a'}" in err and "whose vocabulary differs" in err and "2 token(s)" in err
    assert cli(["tune", str(world / "run"), "--target", str(world / "c"), "--benchmark", str(world / "p.jsonl"),
                "--no-write", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drafterkit tune: error: ") and "whose vocabulary differs" in err


def test_export_and_serve_check_warn_for_another_target(world, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_VLLM_VENV", str(world / "no-vllm-venv"))
    out = world / "export"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(["export", str(world / "run"), "--format", "vllm-eagle3", "--target", str(world / "b"),
                    "--output", str(out), "--overwrite"]) == 0
    assert len(_trained_for_lines(caught)) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(["export", str(world / "run"), "--format", "vllm-eagle3", "--target", str(world / "a-copy"),
                    "--output", str(out), "--overwrite"]) == 0
    assert _trained_for_lines(caught) == []
    with warnings.catch_warnings(record=True) as caught:  # said before it looks for vLLM (absent here: rc 2)
        warnings.simplefilter("always")
        assert cli(["serve-check", str(out), "--target", str(world / "b"), "--benchmark",
                    str(world / "p.jsonl")]) == 2
    lines = _trained_for_lines(caught)
    assert len(lines) == 1 and lines[0].startswith(f"{out}: this eagle3 drafter was trained for target")


def test_an_export_given_as_the_target_is_named_as_a_drafter_export(world, tmp_path, capsys):
    """A drafter export given where the target goes is said to be one, with the target its drafter was trained for
    (it was "holds no tokenizer ...; save the tokenizer there too"), by eval and by training's recipe check."""
    out = tmp_path / "exported"
    assert cli(["export", str(world / "run"), "--format", "vllm-eagle3", "--output", str(out)]) == 0
    capsys.readouterr()
    assert cli(_eval(world, str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"drafterkit eval: error: target {out} is a drafterkit eagle3 export (what drafterkit export "
                          "writes for a serving engine), a drafter, not a target model; its drafter was trained for "
                          f"target {world / 'a'}: give that")
    assert "holds no tokenizer" not in err
    recipe = world / "run" / "checkpoints" / "best" / "recipe.yaml"
    with warnings.catch_warnings(record=True) as caught:  # no check reads the export's config as the target's
        warnings.simplefilter("always")
        assert cli(["train", str(recipe), f"target.name_or_path={out}", f"output_dir={tmp_path / 'run'}"]) == 2
    assert not [w for w in caught if "layer" in str(w.message)]
    err = capsys.readouterr().err.strip()
    assert "is a drafterkit eagle3 export" in err and f"trained for target {world / 'a'}" in err, err


def test_the_quickstart_refuses_another_target(world, capsys):
    """The quickstart trains and measures the default target: a --set naming another was trained on the default
    target while its recipe.yaml recorded the other (so eval then warned of a target it never trained for)."""
    capsys.readouterr()
    assert cli(["quickstart", "--set", f"target.name_or_path={world / 'b'}", "--set",
                "drafter.options.draft_vocab_size=64", "--output-dir", str(world / "qs"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"drafterkit quickstart: error: target.name_or_path {world / 'b'}: the quickstart trains "
                          "and measures a drafter for the default target") and len(err.splitlines()) == 1
    assert not (world / "qs").exists()


def test_a_copy_with_another_tokenizer_is_another_target(world, capsys):
    """Same config and weights, two token ids swapped in tokenizer.json: not the same target, so the vocabulary
    check runs and refuses it (it used to pass as a copy of ``a``)."""
    assert not same_target(str(world / "a-swapped"), str(world / "a"))
    with pytest.raises(DrafterLoadError, match="whose vocabulary differs"):
        trained_for_problem(world / "run", str(world / "a-swapped"))
    capsys.readouterr()
    assert cli(_eval(world, str(world / "a-swapped"))) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drafterkit eval: error: ") and "2 token(s) have other ids" in err


def test_eval_and_tune_without_target_use_the_recorded_one(world, capsys):
    """No --target: the target the checkpoint's recipe.yaml records, said in one line, not the default one."""
    argv = _eval(world, "x")
    del argv[1:3]  # no --target
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(argv) == 0
    out = capsys.readouterr().out
    assert f"drafterkit eval: --target {world / 'a'} (the target --drafter {world / 'run'} was trained for" in out
    assert _trained_for_lines(caught) == []
    assert json.loads((world / "out.json").read_text())["config"]["target"] == str(world / "a")
    assert cli(["tune", str(world / "run"), "--benchmark", str(world / "p.jsonl"), "--num-prompts", "1",
                "--max-new-tokens", "4", "--k", "2", "--tree", "2,1", "--dynamic", "", "--draft-threshold", "0",
                "--incumbent", "none", "--concurrency", "1", "--no-write", "--no-progress", "--device", "cpu"]) == 0
    assert f"drafterkit tune: --target {world / 'a'} (the target {world / 'run'} was trained for" in \
        capsys.readouterr().out
    argv[argv.index("--drafter") + 1] = str(world / "lm-run")  # a draft LM: its recorded target too
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert f"drafterkit eval: --target {world / 'b'} (the target --drafter {world / 'lm-run'} was trained" in out
    assert json.loads((world / "out.json").read_text())["config"]["target"] == str(world / "b")


def test_drafters_recording_different_targets_need_a_target(world, capsys):
    argv = _eval(world, "x")
    del argv[1:3]
    argv += ["--drafter", str(world / "run-b")]
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"drafterkit eval: error: --drafter {world / 'run'} was trained for target {world / 'a'} but "
                   f"--drafter {world / 'run-b'} for {world / 'b'} (their recipe.yaml): pass --target to say which "
                   "target to measure them with")


@pytest.mark.parametrize("other, says", [("wide", "hidden 32"), ("padded", "LM head rows 384")])
def test_a_target_of_another_shape_gets_the_shape_error_alone(world, capsys, other, says):
    """The warning said "both have the same hidden size and layer count ... so it runs" (or, for a copy whose LM head
    is padded to more rows, "... and the same vocabulary") before the shape error that contradicted it; now the
    shape error stands alone."""
    assert shapes_match(world / "run" / "checkpoints" / "best" / "drafter", str(world / other)) is False
    assert trained_for_problem(world / "run", str(world / other)) is None
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(_eval(world, str(world / other))) == 2
    assert _trained_for_lines(caught) == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("drafterkit eval: error: ") and says in err and len(err.splitlines()) == 1, err
    line = trained_for_problem(world / "run", str(world / "b"))
    assert f"{world / 'b'} has the hidden size and layer count the drafter reads" in line and "so it runs" not in line


def test_load_drafter_warns_as_the_cli_does(world):
    """The Python API says what the CLI says: a head loaded next to another target than its recipe records."""
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(world / "b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_drafter(world / "run", target=other)
    lines = _trained_for_lines(caught)
    assert len(lines) == 1 and lines[0].startswith(f"{world / 'run' / 'checkpoints' / 'best' / 'drafter'}: this "
                                                   f"eagle3 drafter was trained for target {world / 'a'}")
    assert f"pass a target loaded from {world / 'a'}" in lines[0]
    same = AutoModelForCausalLM.from_pretrained(world / "a-copy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_drafter(world / "run", target=same)
        load_drafter(world / "run", target=other, trained_for=False)
    assert _trained_for_lines(caught) == []
