"""Assistant-only loss mask under each family's real chat template (golden tests), the system turn a template
refuses, Qwen3's reasoning blocks, skip counts and the too-many-dropped refusal, and eval prompts under the
same templates. Tokenizers: tests/chat_templates.py (tiny byte-level BPE with each family's tokens)."""

from __future__ import annotations

import json
import warnings

import jinja2
import pytest
import torch
from chat_templates import FAMILIES, generation_eos_ids, tiny_tokenizer
from conftest import tiny_llama

from drafterkit.assets.chat import end_of_turn_tokens, render_chat, template_end_of_turn
from drafterkit.speceval.prompts import chat_ids, select_prompts
from drafterkit.train.data import DataStats, build_dataset
from drafterkit.train.loss_mask import SkipExample, tokenize_chat, tokenize_conversation

CONV = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4. Anything else?"},
    {"role": "user", "content": "And 3*3, in words?"},
    {"role": "assistant", "content": "Nine."},
]
REPLIES = ["It is 4. Anything else?", "Nine."]

# What each family's target emits for CONV's two assistant turns: the reply and the family's end-of-turn token.
# Mistral's template writes " " + reply and the tokenizer merges that space into the first reply token (as
# SentencePiece's "▁" does), so the target emits it. Gemma-2 and Mistral-7B-v0.3 have no place for the system
# turn: it is merged into the first user turn.
GOLDEN = {
    "llama3": ([r + "<|eot_id|>" for r in REPLIES], False),
    "qwen2.5": ([r + "<|im_end|>" for r in REPLIES], False),
    "qwen3": ([r + "<|im_end|>" for r in REPLIES], False),  # the last turn's empty <think></think> unsupervised
    "gemma2": ([r + "<end_of_turn>" for r in REPLIES], True),
    "mistral": ([" " + r + "</s>" for r in REPLIES], True),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    tok = tiny_tokenizer(request.param)
    return request.param, tok, end_of_turn_tokens(tok, generation_eos_ids(tok, request.param))


def _runs(mask):
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _supervised(tok, ids, mask):
    return [tok.decode(ids[a:b]) for a, b in _runs(mask)]


@pytest.mark.parametrize("method", ["offsets", "prefix_tokens"])
def test_golden_mask_is_each_reply_and_its_end_of_turn_token(family, method):
    name, tok, eots = family
    ids, mask, _, merged = tokenize_chat(tok, CONV, 4096, method, eots)
    expected, merges = GOLDEN[name]
    assert _supervised(tok, ids, mask) == expected and merged is merges
    assert FAMILIES[name].end_of_turn in eots
    eot_id = tok.convert_tokens_to_ids(FAMILIES[name].end_of_turn)
    for a, b in _runs(mask):
        assert ids[b - 1] == eot_id and mask[a - 1] == 0  # the end-of-turn token supervised, the header not
    text = tok.decode(ids)
    assert "You answer in one line." in text  # the system turn is in the context, merged or not
    if merges:
        assert "You answer in one line.\n\nWhat is 2+2?" in text


def test_end_of_turn_tokens_come_from_generation_config_the_tokenizer_and_the_template(family):
    name, tok, eots = family
    fam = FAMILIES[name]
    assert template_end_of_turn(tok) == fam.end_of_turn
    assert eots[:len(fam.generation_eos)] == list(fam.generation_eos) and fam.eos in eots
    # Gemma's tokenizer EOS is <eos>, yet its turns end with <end_of_turn>: the mask ends there either way
    assert end_of_turn_tokens(tok)[-1] == fam.end_of_turn


def test_gemma_system_turn_is_merged_and_a_refusal_without_system_is_a_counted_skip():
    tok = tiny_tokenizer("gemma2")
    with pytest.raises(jinja2.TemplateError, match="System role not supported"):  # what escaped before
        tok.apply_chat_template(CONV, tokenize=False)
    out = tokenize_conversation(tok, CONV, 4096)
    assert tok.decode(out["input_ids"]).startswith(
        "<bos><start_of_turn>user\nYou answer in one line.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    with pytest.raises(SkipExample) as skip:
        tokenize_conversation(tok, bad, 4096)
    assert skip.value.reason == "template_error" and "must alternate" in skip.value.detail
    assert render_chat(tok, CONV[:2], generation_prompt=True) == (
        "<bos><start_of_turn>user\nYou answer in one line.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", True)


def test_qwen3_reasoning_of_the_last_turn_is_supervised_earlier_reasoning_is_not_in_the_example():
    tok = tiny_tokenizer("qwen3")
    conv = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\nIt is 4."},
            {"role": "user", "content": "And 3*3?"},
            {"role": "assistant", "content": "<think>\nThree threes.\n</think>\n\nNine."}]
    for method in ("offsets", "prefix_tokens"):
        ids, mask, _, _ = tokenize_chat(tok, conv, 4096, method)
        assert _supervised(tok, ids, mask) == ["It is 4.<|im_end|>",
                                               "<think>\nThree threes.\n</think>\n\nNine.<|im_end|>"]
        assert "Add two and two" not in tok.decode(ids)  # the template strips it from the context
    think, end_think = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    assert think in ids and end_think in ids  # one id each, and supervised (the target generates them)


def test_qwen3_empty_reasoning_block_of_a_last_turn_is_template_text_not_supervised():
    tok = tiny_tokenizer("qwen3")
    ids, mask, _, _ = tokenize_chat(tok, CONV[1:3], 4096)
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 4. Anything else?<|im_end|>\n")
    assert _supervised(tok, ids, mask) == ["It is 4. Anything else?<|im_end|>"]


def _chat_file(path, conversations):
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def test_skips_are_counted_printed_and_too_many_refuse_the_data(tmp_path):
    tok = tiny_tokenizer("gemma2")
    good = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."},
             {"role": "assistant", "content": f"It is {i}."}] for i in range(7)]
    bad = [[{"role": "user", "content": "Say <start_of_turn> please."}, {"role": "assistant", "content": "No."}]
           for _ in range(3)]
    path = _chat_file(tmp_path / "chat.jsonl", good + bad)
    kw = dict(max_length=128, heldout_fraction=0.0, cache_dir=tmp_path / "cache", format="chat",
              eos_token_id=generation_eos_ids(tok, "gemma2"))
    for _ in range(2):  # fresh, then from the cache: the same counts and the same refusal
        with pytest.raises(ValueError) as err:
            build_dataset(path, tok, max_skipped_fraction=0.05, **kw)
        msg = str(err.value)
        assert "3 of 10 train conversations (30.0%) gave no example (3 special_token_in_content)" in msg
        assert "data.max_skipped_fraction=0.05" in msg and "clean the data" in msg
    stats = DataStats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = build_dataset(path, tok, max_skipped_fraction=0.5, stats=stats, **kw)
    assert len(ds) == 7 and stats.skipped == {"special_token_in_content": 3} and stats.system_merged == 7
    said = [str(w.message) for w in caught if "gave no example" in str(w.message)]
    assert len(said) == 1 and "3 train conversations of 10 gave no example: 3 special_token_in_content" in said[0]
    assert "7 system turns merged into the first user turn" in said[0]


def test_truncation_losses_are_reported_but_not_counted_against_the_share(tmp_path):
    tok = tiny_tokenizer("qwen2.5")
    long_user = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "Ok."}]
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    path = _chat_file(tmp_path / "chat.jsonl", [long_user] * 3 + [short] * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = build_dataset(path, tok, max_length=160, heldout_fraction=0.0, cache_dir=tmp_path / "c", format="chat",
                           max_skipped_fraction=0.0)
    assert len(ds) == 3
    assert any("3 no_supervised_token_after_truncation" in str(w.message) for w in caught)
    said = next(str(w.message) for w in caught if "gave no example" in str(w.message))
    assert ("in 3 conversations, 50% of the split the text before the first assistant reply fills data.max_length "
            "(160 tokens), so no reply token is left to learn from; raise data.max_length") in said  # why, the fix


def test_recipe_max_skipped_fraction_reaches_the_data(tmp_path):
    from drafterkit.train.recipe import RecipeError, recipe_from_dict
    from drafterkit.train.recipe_data import load_data

    with pytest.raises(RecipeError, match=r"data\.max_skipped_fraction"):
        recipe_from_dict({"output_dir": "x"}, ["data.max_skipped_fraction=1.5"])
    tok = tiny_tokenizer("gemma2")
    conv = [{"role": "user", "content": "Hi <end_of_turn>"}, {"role": "assistant", "content": "Hello."}]
    path = _chat_file(tmp_path / "chat.jsonl", [conv, CONV[1:3], CONV[1:3]])
    target = tiny_llama(0, vocab_size=len(tok))
    target.generation_config.eos_token_id = generation_eos_ids(tok, "gemma2")
    recipe = recipe_from_dict({"output_dir": str(tmp_path / "run"), "data": {
        "source": "jsonl", "path": str(path), "heldout_fraction": 0.0, "max_length": 64}})
    with pytest.raises(ValueError, match=r"1 of 3 train conversations \(33\.3%\)"):
        load_data(recipe, target, tok)
    recipe.data.max_skipped_fraction = 0.5
    assert len(load_data(recipe, target, tok)) == 2


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_eval_prompts_render_under_each_template(name, tmp_path):
    tok = tiny_tokenizer(name)
    ids = chat_ids(tok, CONV[:2])
    text = tok.decode(ids)
    assert "You answer in one line." in text and "What is 2+2?" in text
    rendered = tok.apply_chat_template([{"role": "user", "content": "Q"}], tokenize=False, add_generation_prompt=True)
    gen_prompt = rendered[rendered.rindex("Q") + 1:]  # what follows a user turn up to where the reply starts
    assert text.endswith("What is 2+2?" + gen_prompt)
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"messages": CONV[:2]}) + "\n" + json.dumps({"prompt": "Write a haiku."}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
                    + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sel = select_prompts(str(path), tok, 3)
    refused = [s["id"] for s in sel.skipped if "chat template refuses it" in s["reason"]]
    checks_roles = name in ("gemma2", "mistral")  # their templates refuse two user turns in a row
    assert refused == (["prompts.jsonl:3"] if checks_roles else []) and len(sel.prompts) == 3 - checks_roles
    mt_bench = select_prompts("mt-bench", tok, 8).prompts  # the pinned benchmark, one question per category
    assert len(mt_bench) == 8 and all(tok.decode(p.input_ids).endswith(gen_prompt) for p in mt_bench)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_generation_stops_on_the_familys_end_of_turn_token(name):
    """A tiny target made to emit the family's end-of-turn token where greedy decoding would emit some token X
    (X's LM-head row copied onto it, slightly larger): decode.generate with the target's generation_config
    EOS ids (what eval passes) stops right there, on the end-of-turn token, not the tokenizer's EOS."""
    from drafterkit.decode import generate

    tok = tiny_tokenizer(name)
    target = tiny_llama(0, vocab_size=len(tok))
    prompt = chat_ids(tok, CONV[1:2])
    free = generate(target, [prompt], max_new_tokens=12, eos_token_id=[]).sequences[0]
    eot = tok.convert_tokens_to_ids(FAMILIES[name].end_of_turn)
    with torch.no_grad():
        target.lm_head.weight[eot] = target.lm_head.weight[free[3]] * 1.05
    target.generation_config.eos_token_id = generation_eos_ids(tok, name)
    out = generate(target, [prompt], max_new_tokens=12)
    stop = free.index(free[3])
    assert out.finish_reasons == ["stop"] and out.sequences[0] == free[:stop] + [eot]


@pytest.mark.parametrize("kind", ["draft_lm", "eagle3"])  # eagle3 reads the data while it builds (draft vocabulary)
def test_train_cli_refuses_data_losing_too_many_conversations_in_one_line(kind, tmp_path, capsys, monkeypatch):
    """Through ``drafterkit train``: a Gemma-2-templated target, data whose system turns are merged and 3 of
    10 conversations unusable: one error line (exit 2) before any training step (with the share raised, the
    same data trains: test_recipe_max_skipped_fraction_reaches_the_data)."""
    from drafterkit.cli import main

    tok = tiny_tokenizer("gemma2")
    target = tiny_llama(0, vocab_size=len(tok))
    target.config.eos_token_id = target.generation_config.eos_token_id = generation_eos_ids(tok, "gemma2")
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    good = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."},
             {"role": "assistant", "content": f"It is {i}."}] for i in range(7)]
    bad = [[{"role": "user", "content": "<end_of_turn> hi"}, {"role": "assistant", "content": "No."}]] * 3
    path = _chat_file(tmp_path / "chat.jsonl", good + bad)
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({
        "output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "target")},
        "drafter": {"kind": kind, "options": {"init": "truncated", "num_layers": 1} if kind == "draft_lm" else {}},
        "data": {"source": "jsonl", "path": str(path), "max_length": 64, "heldout_fraction": 0.0},
        "train": {"max_steps": 1, "batch_size": 2, "resume": "never", "cpu": True},
        "eval": {"every": 0, "at_end": False}, "logging": {"trackers": []}}))
    capsys.readouterr()  # saving the target printed progress bars
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    err = [line for line in err.splitlines() if line.startswith("drafterkit")]
    assert len(err) == 1 and err[0].startswith("drafterkit train: error: data: ")
    assert "3 of 10 train conversations (30.0%) gave no example" in err[0] and "data.max_skipped_fraction" in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
