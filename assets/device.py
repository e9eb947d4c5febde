"""Device and dtype strings -> torch objects. Library code never calls ``.cuda()``; it asks here.

``"auto"`` as a dtype is bf16 where the device computes it natively (a CUDA GPU with bf16 support; a
CPU with AVX512-BF16 or AMX-BF16 units) and fp32 elsewhere: on a CPU without bf16 units PyTorch
emulates bf16 matrix products, which measured ~4x slower than fp32 on a 2-core AVX2 EPYC (an EAGLE-3
training step ~105 s in bf16 autocast against ~4-5 s in fp32).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU feature flags (Linux ``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def native_bf16(device: str | torch.device | None = None) -> bool:
    """Whether ``device`` (default: :func:`resolve_device` ``"auto"``) computes bf16 natively: CUDA with
    ``torch.cuda.is_bf16_supported()``; a CPU whose flags hold ``avx512_bf16`` or ``amx_bf16`` (Linux;
    elsewhere, Apple silicon's ``arm64``, which has bf16 instructions from M2 on, counts as native)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if dev.type != "cpu":
        return False
    flags = _cpu_flags()
    if flags:
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    return platform.machine() == "arm64"


def auto_dtype(device: str | torch.device | None = None) -> torch.dtype:
    """``"auto"``: bf16 where ``device`` computes it natively (:func:`native_bf16`), else fp32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device | None = None) -> torch.dtype:
    """Turn ``"fp32" | "bf16" | "fp16" | "auto" | torch.dtype | None`` into a torch dtype (None -> float32;
    ``"auto"`` -> :func:`auto_dtype` of ``device``).

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key == "auto":
        return auto_dtype(device)
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES) + ['auto']}")
    return _DTYPES[key]


#: the flag spelling of each dtype :func:`resolve_dtype` gives (``--dtype bf16``)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_name(dtype: str | torch.dtype | None, device: str | torch.device | None = None) -> str:
    """``dtype`` resolved by :func:`resolve_dtype` (``"auto"``: bf16 where ``device`` has bf16 units, else fp32)
    and spelled as the ``--dtype`` flags take it (``fp32``, ``bf16``, ``fp16``): what a record and a printed command
    hold, so that they name what ran. Raises ``ValueError`` for an unknown name."""
    return DTYPE_NAMES[resolve_dtype(dtype, device)]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn ``"auto" | "cpu" | "cuda" | "cuda:1" | "mps" | None`` into a torch device.

    ``"auto"`` and ``None`` pick CUDA when available, else CPU.

    Raises:
        ValueError: a device string torch does not know (``"tpu"``), or a device named but not available
            here (e.g. ``cuda`` on a CPU machine).
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:  # torch's "Expected one of cpu, cuda, ... device type at start of device string"
        raise ValueError(f"unknown device {str(device)!r}; use auto, cpu, cuda, cuda:N or mps") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available; use --device cpu")
    backend = getattr(torch, dev.type, None)
    if dev.type not in ("cpu", "cuda", "mps") and not getattr(backend, "is_available", lambda: False)():
        raise ValueError(f"device {device!r} requested but this PyTorch build has no {dev.type} device available; "
                         "use --device cpu (or cuda / mps where present)")
    return dev


#: what must agree for a decoding setting measured on one machine (``drafterkit tune``) to apply on another
MACHINE_KEYS = ("cpu", "cpu_count", "threads", "device")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info(device: str | torch.device | None = "auto") -> dict:
    """The :data:`MACHINE_KEYS` of this process: CPU model, cores, torch threads, device (``auto``
    resolved as a target would be loaded, :func:`resolve_device`)."""
    return dict(cpu=cpu_model(), cpu_count=os.cpu_count(), threads=torch.get_num_threads(),
                device=str(resolve_device(device)))


def machine_matches(recorded: dict, current: dict) -> list[str]:
    """The :data:`MACHINE_KEYS` on which ``recorded`` and ``current`` differ, each as ``"key 'a' here 'b'"``
    (``[]``: the same machine; devices compare by type, ``cuda:0`` is ``cuda``)."""
    def norm(k, v):
        return str(v).split(":")[0] if k == "device" else str(v)
    return [f"{k} {recorded.get(k)!r} here {current.get(k)!r}" for k in MACHINE_KEYS
            if norm(k, recorded.get(k)) != norm(k, current.get(k))]


def crowded(busy: float | None, threads: int, cores: int) -> bool:
    """Whether other processes keeping ``busy`` cores busy (at least half a core) and ``threads`` torch
    threads overfill a CPU of ``cores`` cores: measured tokens/s are then low and noisy."""
    return busy is not None and busy >= 0.5 and threads + busy > cores + 0.25


def fitting_threads(busy: float | None, threads: int, cores: int) -> int:
    """The torch threads to decode with beside other processes keeping ``busy`` cores busy: ``threads`` where they
    fit (not :func:`crowded`), else the cores left free (at least 1). Decoding's ops are small, so threads past the
    free cores wait on one another behind the other work at every op (measured on a 2-core CPU with both cores
    busy: 2 threads decoded a tiny target at 3-6 tokens/s, 1 thread at 43-61)."""
    if not crowded(busy, threads, cores):
        return threads
    return max(1, min(threads, int(cores + 0.25 - busy)))


def busy_note(machine: dict) -> str | None:
    """The caveat a report prints beside speed figures measured on a :func:`crowded` CPU (``machine``: the
    record of ``speceval.harness.machine_info``, its ``busy_cores``, ``threads`` and ``cpu_count``), or None."""
    busy = machine.get("busy_cores")
    if not crowded(busy, machine.get("threads") or 1, machine.get("cpu_count") or 1):
        return None
    return (f"measured while other processes kept {busy:.1f} of {machine.get('cpu_count', '?')} CPU cores busy: "
            "its tokens/s are low and noisy; measure again on a quiet machine before comparing them with others'")
