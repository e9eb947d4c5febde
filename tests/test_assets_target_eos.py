"""A target whose config sets an ``eos_token_id`` outside its vocabulary (a token it can never emit) is refused by
the first command that meets it, train and eval alike, with one line naming the file and the fix. Training used
to accept it and eval to refuse it after the target loaded, with advice for the Python API."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_llama

from drafterkit.assets.target import TargetLoadError, load_target, loaded_eos_problem
from drafterkit.cli import main
from drafterkit.decode import generate
from families import save_family


@pytest.fixture(scope="module")
def bad_eos_target(tmp_path_factory):
    """A tiny Qwen3 target folder (320 tokens) whose generation_config.json ends answers at id 400."""
    folder = tmp_path_factory.mktemp("bad-eos") / "target"
    save_family("qwen3", folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 400]}))
    return folder


def _one_error_line(err: str, verb: str, folder) -> None:
    lines = [line for line in err.splitlines() if line.startswith("drafterkit")]
    assert len(lines) == 1 and lines[0].startswith(f"drafterkit {verb}: error: ") and "Traceback" not in err
    assert (f"{folder / 'generation_config.json'} sets eos_token_id [2, 400]: 400 is outside its vocabulary of 320 "
            "tokens" in lines[0]) and "set eos_token_id in" in lines[0]
    assert "Pass None" not in lines[0] and "eos_token_id=" not in lines[0]  # no Python-API advice on the CLI


def test_train_and_eval_refuse_it_alike_before_loading(bad_eos_target, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    chats = tmp_path / "chat.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": "Hello."}]}) + "\n")
    recipe.write_text(json.dumps({
        "output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(bad_eos_target)},
        "drafter": {"kind": "eagle3", "options": {}}, "data": {"source": "jsonl", "path": str(chats), "max_length": 32},
        "train": {"max_steps": 1, "batch_size": 1, "resume": "never"}, "eval": {"every": 0, "at_end": False},
        "logging": {"trackers": []}}))
    capsys.readouterr()
    assert main(["train", str(recipe)]) == 2
    _one_error_line(capsys.readouterr().err, "train", bad_eos_target)
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert main(["eval", "--target", str(bad_eos_target), "--drafter", "ngram", "--num-prompts", "1",
                 "--output", str(tmp_path / "x.json")]) == 2
    _one_error_line(capsys.readouterr().err, "eval", bad_eos_target)
    with pytest.raises(TargetLoadError, match="400 is outside its vocabulary"):
        load_target(str(bad_eos_target))


def test_a_loaded_target_is_checked_as_decoding_reads_its_eos():
    """A Hub target is checked once loaded: generation config, else config, else the tokenizer's EOS."""
    model = tiny_llama(0)  # 128 tokens, EOS 2
    assert loaded_eos_problem(model, None) is None
    model.generation_config.eos_token_id = 128
    assert "its generation_config.json sets eos_token_id 128: 128 is outside its vocabulary of 128 tokens" in \
        loaded_eos_problem(model, None)

    class Tok:
        eos_token_id = 300

    model.generation_config.eos_token_id = model.config.eos_token_id = None
    assert "the tokenizer's eos_token is used) sets eos_token_id 300" in loaded_eos_problem(model, Tok())


def test_generate_refuses_a_default_eos_outside_the_vocabulary_with_the_fix():
    """decode.generate used to refuse such an id when given and take it silently from the config (never stopping)."""
    model = tiny_llama(0)
    model.generation_config.eos_token_id = [2, 500]
    with pytest.raises(ValueError, match=r"sets eos_token_id \[2, 500\], outside its vocabulary \[0, 128\): it can "
                                         r"never be generated. Pass eos_token_id= the id\(s\) that end its answers"):
        generate(model, [[1, 5]], max_new_tokens=2)
    assert generate(model, [[1, 5]], max_new_tokens=2, eos_token_id=[2]).sequences[0]  # the fix it names works
