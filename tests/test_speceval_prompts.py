"""speceval.prompts: benchmark prompts chat-templated as the target serves them (golden text of the
default target's template), balanced over categories, too-long prompts skipped whole, never cut."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from drafterkit.assets.chat import NoChatTemplateError
from drafterkit.assets.pinned import default_target_dir
from drafterkit.speceval.prompts import chat_ids, load_prompts, select_prompts


@pytest.fixture(scope="module")
def tok():
    """The default target's tokenizer (SmolLM2, ChatML template)."""
    return AutoTokenizer.from_pretrained(default_target_dir())


def test_chat_ids_are_the_targets_template_up_to_the_assistant_header(tok):
    ids = chat_ids(tok, [{"role": "user", "content": "Name three prime numbers."}])
    assert tok.decode(ids) == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                               "Face<|im_end|>\n<|im_start|>user\nName three prime numbers.<|im_end|>\n"
                               "<|im_start|>assistant\n")
    plain = copy.deepcopy(tok)
    plain.chat_template = None  # no template: refused as training refuses it (never raw text joined)
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(NoChatTemplateError, match="its tokenizer has no chat template"):
        chat_ids(plain, msgs)


def test_mt_bench_prompts_cover_every_category_and_use_the_chat_template(tok):
    prompts = load_prompts("mt-bench", tok, 8)
    assert len({p.category for p in prompts}) == 8
    assert all(p.input_ids == chat_ids(tok, p.messages) for p in prompts)
    text = tok.decode(prompts[0].input_ids)
    assert text.rstrip().endswith("<|im_start|>assistant") and prompts[0].messages[0]["content"] in text
    code = load_prompts("humaneval", tok, 2)
    assert {p.category for p in code} == {"code"} and "def " in code[0].messages[0]["content"]
    with pytest.raises(ValueError, match="--num-prompts"):
        load_prompts("mt-bench", tok, 0)


def test_too_long_prompts_are_skipped_whole_and_recorded(tok):
    chosen = select_prompts("mt-bench", tok, 8, max_prompt_tokens=60, limit_name="the context")
    assert len(chosen.prompts) == 8 and all(len(p.input_ids) <= 60 for p in chosen.prompts)
    assert chosen.skipped and all(s["tokens"] > 60 for s in chosen.skipped)
    assert {s["reason"] for s in chosen.skipped} == {"longer than 60 tokens (the context)"}


def test_fewer_prompts_than_asked_uses_them_all_with_a_warning(tok, prompts_file):
    with pytest.warns(UserWarning, match=r"using 2 prompts, fewer than the 8 asked"):
        assert len(load_prompts(str(prompts_file), tok, 8)) == 2
    with pytest.raises(ValueError, match="no prompt of at most 1 tokens"):
        load_prompts(str(prompts_file), tok, 8, max_prompt_tokens=1)
