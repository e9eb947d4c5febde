"""The target's transformers config read from local files alone (a folder, the default target once built, a Hub
id in the local Hugging Face cache), and what recipe checks read from it before any model loads: never downloads,
converts or loads weights, so a recipe is checked against its target in a second or two."""

from __future__ import annotations

from typing import Any

from drafterkit.assets.pinned import local_target_source


def vocab_size(config: Any) -> int | None:
    """A transformers config's vocabulary size (its text config's, for a multimodal one), or None."""
    n = getattr(config.get_text_config(), "vocab_size", None) if config is not None else None
    return n if isinstance(n, int) else None


def local_layer_count(name_or_path: str) -> int | None:
    """The target's ``num_hidden_layers`` when local files alone give its config (a folder, the default
    target once built, a Hub id in the local Hugging Face cache), else None: never downloads, converts or
    loads weights, so a recipe can be checked before any model loads."""
    config = local_config(name_or_path)
    n = getattr(config, "num_hidden_layers", None) if config is not None else None
    return int(n) if n is not None else None


def local_config(name_or_path: str):
    """The target's transformers config when local files alone give it (see :func:`local_layer_count`), else None."""
    from transformers import AutoConfig

    path = local_target_source(name_or_path)
    if path is None:
        return None
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None


def meta_target(name_or_path: str):
    """The target's causal LM built from its local config on the meta device (modules and shapes, no
    weights, no memory), or None when the config is not readable locally or names no causal-LM class."""
    import torch
    from transformers import AutoModelForCausalLM

    config = local_config(name_or_path)
    if config is None:
        return None
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception:  # any config transformers cannot build here: the build itself reports it
        return None
