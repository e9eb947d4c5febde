"""decode.cache: the ragged KV cache masks rejected columns and crops to the longest row."""

import torch

from conftest import tiny_llama
from drafterkit.decode.cache import RaggedCache


def test_ragged_cache_masks_and_crops():
    model = tiny_llama(0)
    c = RaggedCache(model, 2, torch.device("cpu"), capacity=4)
    c.prefill([[5, 6, 7], [8]], logits_to_keep=1)
    assert c.length == 3 and c.n_real.tolist() == [3, 1]
    c.run(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    c.keep(torch.tensor([1, 3]))
    assert c.length == 6 and c.cache.get_seq_length() == 6 and c.n_real.tolist() == [4, 4]
    assert c.mask[:, :6].tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    c.run(torch.tensor([[9, 9], [9, 9]]))
    c.keep(torch.tensor([1, 0]))
    assert c.length == 7 and c.cache.get_seq_length() == 7 and c.mask.shape[1] >= 7


def test_the_model_fills_the_cache_under_the_installed_transformers_name():
    """transformers renamed a model's ``past_key_values`` argument and output field ``cache`` (5.2x); 5.17 (the GPU
    machine's) takes an unknown ``cache=`` into **kwargs and ignores it, attending to the new tokens alone.
    RaggedCache passes and reads the cache under the installed release's name, so the model fills it."""
    import inspect

    from transformers import LlamaForCausalLM

    from drafterkit.decode.cache import CACHE_ARG

    assert CACHE_ARG in inspect.signature(LlamaForCausalLM.forward).parameters
    c = RaggedCache(tiny_llama(0), 1, torch.device("cpu"))
    c.prefill([[5, 6, 7]], logits_to_keep=1)
    assert c.cache.get_seq_length() == 3
    out = c.run(torch.tensor([[1, 2]]))
    assert c.cache.get_seq_length() == 5 and getattr(out, CACHE_ARG) is c.cache
