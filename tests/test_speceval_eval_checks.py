"""``drafterkit eval``'s checks before it measures, through the real CLI on tiny saved targets: usage errors come
before any note about the run (a tuned setting it takes)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from families import save_family

from drafterkit.assets.device import host_info
from drafterkit.cli import main as cli
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """``target`` (a tiny llama3-family folder with a ChatML template), ``drafter`` (an EAGLE-3 head for it, with a
    usable ``drafterkit tune`` record in its decoding.json) and ``prompts`` (a prompt file)."""
    root = tmp_path_factory.mktemp("eval-checks")
    model, _ = save_family("llama3", root / "target")
    torch.manual_seed(0)
    head = Eagle3Drafter(Eagle3Config.from_target(model, draft_vocab_size=64), target=model)
    head.set_draft_vocab(torch.arange(64), target=model)
    drafter = head.save_pretrained(root / "drafter")
    tuned = dict(written_by="drafterkit tune", machine=host_info("cpu"), dtype="fp32",
                 winners={"1": dict(tree="chain", k=3, draft_threshold=0.0, speedup=1.3, tau=2.0)})
    (drafter / "decoding.json").write_text(json.dumps(dict(tuned=tuned)))
    shutil.copytree(root / "target", root / "nochat")
    config = json.loads((root / "nochat" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (root / "nochat" / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "nochat" / "chat_template.jinja").unlink(missing_ok=True)
    prompts = root / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello world"}) + "\n")
    return dict(target=root / "target", drafter=drafter, prompts=prompts, root=root)


def _eval(world, *extra: str) -> list[str]:
    return ["eval", "--target", str(world["target"]), "--drafter", str(world["drafter"]), "--device", "cpu",
            "--benchmark", str(world["prompts"]), "--num-prompts", "1", "--max-new-tokens", "4", "--baselines",
            "engine", "--no-progress", "--output", str(world["root"] / "out.json"), *extra]


@pytest.mark.parametrize("extra, error", [
    (["--drafter", "bogus"], "--drafter bogus: not 'ngram'"),
    (["--draft-threshold", "1.5"], "--draft-threshold values must be in [0, 1)"),
    (["--tree", "3,x"], "--tree '3,x'"),
    (["--target", "/nonexistent/target"], "target /nonexistent/target does not exist"),
    (["--target", "NOCHAT"], "its tokenizer has no chat template"),
    (["--drafter", "draft:1", "--k", "100"], "--k 100: at most 32 draft tokens per verification"),
    (["--sweep", "--sweep-k", "1,64"], "--sweep-k 64: at most 32 draft tokens per verification"),
])
def test_usage_errors_come_before_the_tuned_note(world, capsys, extra, error):
    """A tuned checkpoint's note ("decoding settings taken from it") is said only once every argument passed: an
    argument error is the only thing printed (it used to follow the note, as if the run had started)."""
    capsys.readouterr()
    extra = [str(world["root"] / "nochat") if x == "NOCHAT" else x for x in extra]
    assert cli(_eval(world, *extra)) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    assert err.startswith("drafterkit eval: error: ") and error in err and len(err.strip().splitlines()) == 1, err


def test_the_tuned_note_is_said_when_the_arguments_pass(world, capsys):
    capsys.readouterr()
    assert cli(_eval(world)) == 0
    out = capsys.readouterr().out
    assert f"drafterkit eval: {world['drafter'] / 'decoding.json'}" in out and "taken from it" in out
    assert out.index("taken from it") < out.index("wrote ")


def test_a_damaged_drafter_folder_is_named_with_what_is_wrong_first(tmp_path, capsys):
    """A folder given as --drafter that holds no readable drafter: the error opens with what is wrong with it, not
    with the list of spec forms a mistyped name gets."""
    from drafterkit.speceval.methods import check_drafter_spec

    (tmp_path / "config.json").write_text("{bad")
    with pytest.raises(ValueError) as exc:
        check_drafter_spec(str(tmp_path))
    assert str(exc.value).startswith(f"--drafter {tmp_path}: {tmp_path} is not a drafter checkpoint")
    assert "config.json is not valid JSON" in str(exc.value) and "not 'ngram'" not in str(exc.value)


def test_an_absurd_k_is_refused_by_every_command_that_takes_one(world, capsys, tmp_path):
    """One bound on draft tokens per verification (the longest block a DFlash / DSpark drafter drafts, also the bound
    of their block_size): eval's --k above (a draft LM's --k 100 used to run), tune's and serve-check's --k and a
    recipe's eval.k, each refused in one line before anything loads."""
    from drafterkit.speceval.eval_args import MAX_DRAFT_TOKENS
    from drafterkit.speceval.tune import check_settings
    from drafterkit.train.recipe import RecipeError, recipe_from_dict

    assert MAX_DRAFT_TOKENS == 32
    with pytest.raises(ValueError, match=r"^--k 33: at most 32 draft tokens per verification .*give --k of at most "):
        check_settings([3, 33], ["chain"], [], 16)
    check_settings([32], ["chain"], [], 16)
    capsys.readouterr()
    assert cli(["serve-check", str(tmp_path), "--k", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drafterkit serve-check: error: --k 100: at most 32") and len(err.splitlines()) == 1
    with pytest.raises(RecipeError, match=r"eval\.k"):
        recipe_from_dict({"output_dir": str(tmp_path / "run"), "eval": {"k": 100}})
    with pytest.raises(RecipeError, match=r"drafter\.options\.block_size"):
        recipe_from_dict({"output_dir": str(tmp_path / "run"), "drafter": {"kind": "dspark", "options": {
            "block_size": 33}}})
