"""train.evaluate: in-training evaluation feeds the decoder the token ids ``drafterkit eval`` feeds it.

The real SmolLM2 tokenizer (pinned asset) with tiny seeded random models: the prompt ids depend only on
the tokenizer, the benchmark and the target's context, never on ``data.max_length``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from conftest import tiny_llama

from drafterkit import decode
from drafterkit.speceval.prompts import load_prompts
from drafterkit.train.evaluate import eval_prompt_ids
from drafterkit.train.recipe import recipe_from_dict

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "recipes" / "gpu").glob("*.yaml"))
CONTEXT = 8192  # SmolLM2-135M-Instruct's max_position_embeddings
LONG_QUESTIONS = ("mt-bench/133", "mt-bench/136", "mt-bench/138", "mt-bench/140")  # > 256 tokens each


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from drafterkit.assets.pinned import default_target_dir

    return AutoTokenizer.from_pretrained(default_target_dir())


def _tiny_target(tok, context: int):
    model = tiny_llama(0, vocab_size=49152, hidden_size=32)
    model.config.max_position_embeddings = context
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    return model


@pytest.fixture(scope="module")
def target_dir(tok, tmp_path_factory):
    """A tiny target with the default target's context, saved with the real tokenizer."""
    path = tmp_path_factory.mktemp("tiny-target")
    _tiny_target(tok, CONTEXT).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _spy_generate(monkeypatch) -> list[list[int]]:
    """Record the rows of every ``decode.generate`` call (what the decoder is fed)."""
    fed, real = [], decode.generate

    def spy(target, input_ids, **kw):
        fed.extend(list(r) for r in input_ids)
        return real(target, input_ids, **kw)

    monkeypatch.setattr(decode, "generate", spy)
    return fed


@pytest.fixture(scope="module")
def cli_ids(target_dir, tmp_path_factory):
    """The ids ``drafterkit eval --benchmark mt-bench --num-prompts 80`` feeds the decoder, by question id."""
    from drafterkit.cli import main

    out = tmp_path_factory.mktemp("eval") / "e.json"
    with pytest.MonkeyPatch.context() as mp:
        fed = _spy_generate(mp)
        rc = main(["eval", "--target", str(target_dir), "--drafter", "none", "--baselines", "engine",
                   "--benchmark", "mt-bench", "--num-prompts", "80", "--max-new-tokens", "1", "--device", "cpu",
                   "--no-progress", "--output", str(out)])
    assert rc == 0
    order = [p["id"] for p in json.loads(out.read_text())["prompts"]]
    assert len(order) == 80 and len(fed) == 81  # one uncounted warm-up call, then every question once
    return dict(zip(order, fed[1:]))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_in_training_mt_bench_ids_equal_drafterkit_eval_ids_under_every_recipe(path, tok, cli_ids, tmp_path):
    # Every MT-bench question, under this recipe's data.max_length (256 in the CPU recipes), and the
    # recipe's own eval.num_prompts: the same questions, in the same order, with the same ids.
    # Only what the prompts can depend on is taken from the recipe (the whole recipes are validated in
    # test_train_recipe); the gpu recipes' target has another tokenizer, their max_length is checked here.
    shipped = yaml.safe_load(path.read_text())
    max_length, num_prompts = shipped["data"]["max_length"], shipped["eval"]["num_prompts"]

    def recipe(n):
        return recipe_from_dict({"output_dir": str(tmp_path), "data": {"max_length": max_length},
                                 "eval": {**shipped["eval"], "prompts": "mt_bench", "num_prompts": n}})

    target = _tiny_target(tok, CONTEXT)
    every = eval_prompt_ids(recipe(80), tok, target)
    assert every.prompt_ids and set(every.prompt_ids) == set(cli_ids) and not every.skipped
    for qid, ids in zip(every.prompt_ids, every.ids):
        assert ids == cli_ids[qid], qid
        assert tok.decode(ids[:3]).startswith("<|im_start|>system")  # the chat header is there
    assert all(len(cli_ids[q]) > 256 for q in LONG_QUESTIONS)  # what max_length 256 used to cut
    own = eval_prompt_ids(recipe(num_prompts), tok, target)
    assert own.prompt_ids == [p.id for p in load_prompts("mt-bench", tok, num_prompts)]
    assert own.ids == [cli_ids[q] for q in own.prompt_ids]


def test_sharegpt_heldout_equals_drafterkit_eval_sharegpt(tok, tmp_path, monkeypatch):
    # The held-out split of the file training reads, drawn as `drafterkit eval --benchmark sharegpt` draws it.
    rnd, words = random.Random(0), "the cat sat on a mat and then ran to the big red house".split()
    data = [{"id": f"c{i}_0", "conversations": [
        {"from": "human", "value": " ".join(rnd.choices(words, k=rnd.randint(4, 400)))},
        {"from": "gpt", "value": "ok"}]} for i in range(600)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    from drafterkit.assets import pinned
    monkeypatch.setattr(pinned, "fetch", lambda name, **kw: path if name == "sharegpt" else None)
    recipe = recipe_from_dict({"output_dir": str(tmp_path / "run"), "data": {"path": str(path), "max_length": 64},
                               "eval": {"num_prompts": 3, "max_new_tokens": 8}})
    got = eval_prompt_ids(recipe, tok, _tiny_target(tok, CONTEXT))
    want = load_prompts("sharegpt", tok, 3)
    assert got.ids == [p.input_ids for p in want] and len(got.ids) == 3
    assert max(len(ids) for ids in got.ids) > 64  # data.max_length cuts training examples, not eval prompts


def test_a_prompt_too_long_for_the_context_is_skipped_and_counted_never_truncated(tok, tmp_path, monkeypatch):
    # Context 364 - 64 new tokens: MT-bench 133, 138 and 140 (402, 380, 373 tokens) do not fit.
    target = _tiny_target(tok, 364)
    recipe = recipe_from_dict({"output_dir": str(tmp_path), "data": {"max_length": 64},
                               "eval": {"prompts": "mt_bench", "num_prompts": 80, "max_new_tokens": 64}})
    with pytest.warns(UserWarning, match=r"skipped 3 .*mt-bench/133.*longer than 300 tokens"):
        got = eval_prompt_ids(recipe, tok, target)
    full = {p.id: p.input_ids for p in load_prompts("mt-bench", tok, 80)}
    assert sorted(s["id"] for s in got.skipped) == ["mt-bench/133", "mt-bench/138", "mt-bench/140"]
    assert all(s["tokens"] == len(full[s["id"]]) > 300 for s in got.skipped)
    assert len(got.ids) == 77 and all(ids == full[q] for q, ids in zip(got.prompt_ids, got.ids))
    rec = got.record()
    assert rec["asked"] == 80 and rec["used"] == 77 and rec["skipped"] == 3
    assert rec["skip_reasons"] == {"longer than 300 tokens (the target's context 364 - eval.max_new_tokens 64)": 3}

    # asked for fewer: the next question that fits is taken (MT-bench 133 is the 22nd), as drafterkit eval does
    recipe = recipe_from_dict({"output_dir": str(tmp_path), "eval": {"prompts": "mt_bench", "num_prompts": 24,
                                                                     "max_new_tokens": 64}})
    with pytest.warns(UserWarning, match="skipped 1 "):
        got = eval_prompt_ids(recipe, tok, target)
    assert len(got.ids) == 24 and got.prompt_ids == [p.id for p in load_prompts("mt-bench", tok, 24,
                                                                                  max_prompt_tokens=300)]
    assert "mt-bench/133" not in got.prompt_ids and got.prompt_ids[:21] == list(full)[:21]

    recipe = recipe_from_dict({"output_dir": str(tmp_path), "eval": {"prompts": "mt_bench", "max_new_tokens": 360}})
    with pytest.raises(ValueError, match=r"no prompt of at most 4 tokens among 80; raise the target's context"):
        eval_prompt_ids(recipe, tok, target)


def test_the_eval_result_json_counts_the_skipped_prompts(tok, tmp_path, monkeypatch):
    # End to end through the training loop: the decoder is fed the whole prompts that fit, and
    # eval/step-N.json and checkpoints/best/eval.json say how many were skipped and why.
    from drafterkit.assets.pinned import home
    from drafterkit.train.loop import train

    (tmp_path / "home").mkdir()  # the dataset cache stays in tmp; the pinned MT-bench file is the real one
    (tmp_path / "home" / "mt-bench").symlink_to(home() / "mt-bench")
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    target = _tiny_target(tok, 304)  # 304 - 4 new tokens: MT-bench 133 (the 22nd question, 402 tokens) is skipped
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    rnd, words = random.Random(0), "the cat sat on a mat and then ran to the big red house".split()
    with open(tmp_path / "chat.jsonl", "w") as f:
        for i in range(20):
            msgs = [{"role": "user", "content": " ".join(rnd.choices(words, k=6))},
                    {"role": "assistant", "content": " ".join(rnd.choices(words, k=12))}]
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}) + "\n")
    recipe = recipe_from_dict({
        "output_dir": str(tmp_path / "run"),
        "target": {"name_or_path": str(tmp_path / "target")},
        "drafter": {"kind": "draft_lm", "options": {"init": "truncated", "num_layers": 1}},
        "data": {"source": "jsonl", "path": str(tmp_path / "chat.jsonl"), "max_length": 64},
        "train": {"max_steps": 1, "batch_size": 2, "resume": "never"},
        "eval": {"every": 0, "at_end": True, "prompts": "mt_bench", "num_prompts": 24, "max_new_tokens": 4,
                 "k": 2},
        "logging": {"trackers": []},
    })
    fed = _spy_generate(monkeypatch)
    with pytest.warns(UserWarning, match="skipped 1 "):
        train(recipe, target=target, tokenizer=tok)
    chosen = [p.input_ids for p in load_prompts("mt-bench", tok, 24, max_prompt_tokens=300)]
    assert fed == chosen[:1] + chosen  # one uncounted warm-up call, as drafterkit eval's, then every prompt once
    for path in (tmp_path / "run" / "eval" / "step-1.json", tmp_path / "run" / "checkpoints" / "best" / "eval.json"):
        rec = json.loads(path.read_text())["prompts"]
        assert (rec["benchmark"], rec["asked"], rec["used"], rec["skipped"]) == ("mt-bench", 24, 24, 1)
        assert rec["skip_reasons"] == {"longer than 300 tokens (the target's context 304 - eval.max_new_tokens 4)": 1}
        assert rec["skipped_prompts"] == [{"id": "mt-bench/133", "tokens": 402}]
