"""The target's transformers config read from local files alone (a folder, the default target once built, a Hub
id in the local Hugging Face cache), and what recipe checks read from it before any model loads: never downloads,
converts or loads weights, so a recipe is checked against its target in a second or two."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
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


def check_local_feature_layers(recipe: Any, layers, check, warn=None) -> None:
    """Run ``check(layers, num_layers)`` when ``layers`` (``drafter.options.feature_layers``) is set and the target's
    config is readable locally; its ``ValueError`` is re-raised naming ``drafter.options.feature_layers``. ``warn``:
    ``(kind, layers, num_layers) -> line or None`` (EAGLE-3 and P-EAGLE: ``drafters.export.eagle3_layout.
    repeated_layers_warning``, feature layer ids that repeat a layer, ``layers`` or else the target's default, which
    the kind's engine exports refuse), warned as a ``UserWarning`` when it gives a line."""
    n = local_layer_count(recipe.target.name_or_path) if layers is not None or warn is not None else None
    if n is None:
        return
    if layers is not None:
        try:
            check(layers, n)
        except ValueError as exc:
            raise ValueError(f"drafter.options.feature_layers: {exc}") from None
    if warn is not None and (line := warn(recipe.drafter.kind, layers, n)):
        warnings.warn(line, UserWarning, stacklevel=2)


def local_config(name_or_path: str):
    """The target's transformers config when local files alone give it (see :func:`local_layer_count`), else None."""
    from transformers import AutoConfig

    problem = importlib.import_module("drafterkit.assets.target").target_folder_problem  # torch: loaded when used
    path = local_target_source(name_or_path)
    if path is None or (Path(path).is_dir() and problem(path, weights=False, tokenizer=False)):
        return None  # a folder that is no target (a drafter checkpoint or export): refused when the target loads
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
