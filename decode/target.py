"""Load a frozen target: the one function every command and test uses."""

from __future__ import annotations

from pathlib import Path

import torch

from decode.assets import DEFAULT_TARGET_ALIAS, default_target_dir
from decode.device import resolve_device, resolve_dtype


def resolve_target_path(name_or_path: str) -> str:
    """``"smollm2-135m"`` -> the cached converted folder; a local folder -> itself; else a Hub id."""
    if name_or_path == DEFAULT_TARGET_ALIAS:
        return str(default_target_dir())
    return name_or_path


def load_target(name_or_path: str = DEFAULT_TARGET_ALIAS, *, dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu"):
    """Load the target model and tokenizer, frozen (``requires_grad=False``) and in eval mode.

    Args:
        name_or_path: ``"smollm2-135m"`` (the default target, fetched and converted on first use),
            a local transformers folder, or a Hub id (needs the Hub to be reachable).
        dtype: ``"float32" | "bfloat16" | "float16"`` or a torch dtype.
        device: ``"cpu" | "cuda" | "auto" | ...``.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        OSError: a Hub id that cannot be reached (the message says to pass a local folder instead).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_target_path(name_or_path)
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt)
    except OSError as exc:
        if not Path(path).exists():
            raise OSError(
                f"could not load target {name_or_path!r}: not a local folder and the Hugging Face Hub "
                f"is not reachable or has no such repo ({exc.__class__.__name__}). Pass a local "
                f"transformers folder, or '{DEFAULT_TARGET_ALIAS}' for the pinned default target."
            ) from exc
        raise
    model.to(dev).eval()
    model.requires_grad_(False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
