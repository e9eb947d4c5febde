"""The real default target loads frozen and continues a chat prompt into sensible text."""

import pytest
import torch

from decode.device import resolve_device, resolve_dtype


def test_dtype_and_device_strings():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(None) is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("fp12")
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.slow
def test_real_target_is_frozen_and_answers(real_target):
    model, tok = real_target
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text
