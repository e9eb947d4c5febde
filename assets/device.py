"""Device and dtype strings -> torch objects. Library code never calls ``.cuda()``; it asks here."""

from __future__ import annotations

import torch

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """Turn ``"fp32" | "bf16" | "fp16" | torch.dtype | None`` into a torch dtype (None -> float32).

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn ``"auto" | "cpu" | "cuda" | "cuda:1" | "mps" | None`` into a torch device.

    ``"auto"`` and ``None`` pick CUDA when available, else CPU.

    Raises:
        ValueError: when the device is named but not available here (e.g. ``cuda`` on a CPU machine).
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available; use --device cpu")
    return dev
