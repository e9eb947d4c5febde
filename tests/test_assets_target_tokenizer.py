"""A target whose tokenizer cannot load, or has no chat template, is refused by every command that loads it with
drafterkit's one line naming the folder and the fix (never transformers' own message or a traceback), through the
real CLI on tiny saved targets; eval refuses a target without a chat template exactly as training does (one check,
``assets.chat.chat_template_problem``), instead of measuring prompts joined as raw text."""

from __future__ import annotations

import json
import shutil

import pytest
from families import save_family, tiny_tokenizer

from drafterkit.assets.chat import NoChatTemplateError, chat_template_problem
from drafterkit.cli import main as cli
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.speceval.prompts import chat_ids
from drafterkit.train.loss_mask import tokenize_conversation

MESSAGES = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny llama3-family target folders: ``ok``; ``nochat`` (no chat template); ``novocab`` (tokenizer_config.json
    only); ``torn`` (tokenizer.json cut short); plus a draft LM (``drafter``), its hf-assistant export, a chat JSONL
    and a prompt file."""
    root = tmp_path_factory.mktemp("tokenizer-targets")
    model, _ = save_family("llama3", root / "ok")
    for name in ("nochat", "novocab", "torn"):
        shutil.copytree(root / "ok", root / name)
    config = json.loads((root / "nochat" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (root / "nochat" / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "nochat" / "chat_template.jinja").unlink(missing_ok=True)
    (root / "novocab" / "tokenizer.json").unlink()
    (root / "torn" / "tokenizer.json").write_text((root / "ok" / "tokenizer.json").read_text()[:300])
    DraftLM.from_target(model, 1).save_pretrained(root / "drafter")
    assert cli(["export", str(root / "drafter"), "--format", "hf-assistant", "--target", str(root / "ok"),
                "--output", str(root / "export")]) == 0
    (root / "chat.jsonl").write_text("".join(json.dumps({"id": f"c{i}", "messages": MESSAGES}) + "\n"
                                             for i in range(4)))
    (root / "p.jsonl").write_text(json.dumps({"prompt": "hello world"}) + "\n")
    (root / "r.yaml").write_text(f"output_dir: {root / 'run'}\ntarget: {{name_or_path: {root / 'ok'}}}\n"
                                 "drafter: {kind: eagle3, options: {draft_vocab_size: 64}}\n"
                                 f"data: {{source: jsonl, path: {root / 'chat.jsonl'}, num_examples: 4}}\n"
                                 "train: {max_steps: 1, batch_size: 2}\n")
    return root


def test_eval_prompts_and_training_data_refuse_a_tokenizer_without_a_template_with_one_line():
    """The one check: chat_ids (eval, tune, serve-check prompts) joined the contents as raw text where training's
    loss mask refused; both now raise chat_template_problem's line."""
    tok = tiny_tokenizer()
    tok.chat_template = None
    line = chat_template_problem(tok, where="/models/base")
    assert line.startswith("target /models/base: its tokenizer has no chat template") and "\n" not in line
    with pytest.raises(NoChatTemplateError) as prompts:
        chat_ids(tok, MESSAGES[:1])
    with pytest.raises(NoChatTemplateError) as training:
        tokenize_conversation(tok, MESSAGES, max_length=64)
    assert str(prompts.value) == str(training.value) == chat_template_problem(tok)
    assert chat_template_problem(tiny_tokenizer()) is None


def _argv(verb: str, world, target: str) -> list[str]:
    folder = str(world / target)
    return {
        "train": ["train", str(world / "r.yaml"), f"target.name_or_path={folder}"],
        "features": ["features", str(world / "r.yaml"), f"target.name_or_path={folder}"],
        "eval": ["eval", "--target", folder, "--drafter", "ngram", "--benchmark", str(world / "p.jsonl"),
                 "--device", "cpu", "--output", str(world / "out.json")],
        "tune": ["tune", "ngram", "--target", folder, "--benchmark", str(world / "p.jsonl"), "--device", "cpu",
                 "--no-write"],
        "export": ["export", str(world / "drafter"), "--format", "hf-assistant", "--target", folder, "--output",
                   str(world / f"export-{target}"), "--overwrite"],
        "serve-check": ["serve-check", str(world / "export"), "--target", folder, "--benchmark",
                        str(world / "p.jsonl")],
    }[verb]


WHY = {"nochat": "its tokenizer has no chat template", "novocab": "holds tokenizer_config.json but no vocabulary file",
       "torn": "transformers cannot load its tokenizer"}
VERBS = ["train", "features", "eval", "tune", "export", "serve-check"]


@pytest.mark.parametrize("target", ["nochat", "novocab", "torn"])
@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_refuses_a_broken_tokenizer_with_drafterkits_line(world, capsys, monkeypatch, verb, target):
    """Each verb that loads the target answers with one `drafterkit VERB: error:` line naming the folder and the
    fix (serve-check before it looks for its vLLM venv). Export needs no chat template (an hf-assistant export
    saves the tokenizer as it is), so it refuses only a tokenizer that cannot load."""
    monkeypatch.setenv("DRAFTERKIT_VLLM_VENV", str(world / "no-vllm-venv"))
    monkeypatch.setenv("DRAFTERKIT_HOME", str(world / "home"))
    capsys.readouterr()
    rc = cli(_argv(verb, world, target))
    out, err = capsys.readouterr()
    if verb == "export" and target == "nochat":
        assert rc == 0, err
        return
    assert rc == 2, (out, err)
    lines = [x for x in err.strip().splitlines() if x.startswith("drafterkit ")]
    assert len(lines) == 1 and lines[0].startswith(f"drafterkit {verb}: error: "), err
    assert f"target {world / target}" in lines[0] and WHY[target] in lines[0], err
    assert "save" in lines[0] and "Traceback" not in err and "Cannot use chat template" not in err
    assert "Couldn't instantiate" not in err
