"""Refuse a target with recurrent / linear-attention layers the decoder cannot verify, by its name, before any
weights load (any such target when the drafts are trees; a hybrid family it rolls back verifies chains).

Every verb that decodes with a target (train when its recipe is validated, eval, tune, serve-check) asks
:func:`recurrent_target_problem` first: it reads the target's ``config.json`` from local files alone (a folder,
the default target once built, a Hub id in the local Hugging Face cache) and applies
``decode.recurrent.recurrent_problem``, the one rule ``decode.generate`` applies to a loaded target (which is
where a Hub id whose config is not local is refused).
"""

from __future__ import annotations

import json
from pathlib import Path

from drafterkit.assets.pinned import local_target_source
from drafterkit.decode.recurrent import recurrent_problem

__all__ = ["local_config_dict", "recurrent_target_problem"]


def local_config_dict(name_or_path: str) -> dict | None:
    """The target's ``config.json`` as a dict when local files alone give it (the default alias once built, a
    folder, a Hub id in the local Hugging Face cache); None otherwise. Never downloads, converts or loads."""
    path = local_target_source(name_or_path)
    if path is None:
        return None
    try:
        folder = Path(path).expanduser()
        if folder.is_dir():
            file: str | Path | None = folder / "config.json"
        else:  # a Hub id: its config.json in the local Hugging Face cache, if there
            from huggingface_hub import try_to_load_from_cache

            file = try_to_load_from_cache(name_or_path, "config.json")
        config = json.loads(Path(file).read_text(encoding="utf-8-sig")) if isinstance(file, (str, Path)) else None
    except (OSError, ValueError):  # no config.json, not JSON, not a valid Hub id: the loader says so
        return None
    return config if isinstance(config, dict) else None


def recurrent_target_problem(name_or_path: str, where: str | None = None, *, for_trees: bool = False) -> str | None:
    """Why speculative decoding cannot verify with the target ``name_or_path`` (recurrent / linear-attention
    layers of a family the decoder does not roll back, or any with ``for_trees``:
    ``decode.recurrent.recurrent_problem``), one line naming it as ``where`` (default ``target NAME``); None when
    the decoder verifies it (its layers all attention, or a hybrid it rolls back, drafting chains) or its config is
    not local."""
    config = local_config_dict(name_or_path)
    return recurrent_problem(config, where or f"target {name_or_path}", for_trees=for_trees) if config else None
