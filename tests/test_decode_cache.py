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
