"""File modes for what drafterkit writes, without torch (training's checkpoint module and the recipe checks that
read it stay importable before any model library loads)."""

from __future__ import annotations

import os
from pathlib import Path


def umask_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process umask (``0o644`` under 022)."""
    try:  # Linux: read it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def apply_umask(path: str | Path) -> None:
    """Give ``path`` (a file, or every file under a folder) the mode a plain ``open()`` would.

    safetensors (>= 0.6) writes through a private temporary file, so its files come out ``0600``:
    a serving engine running as another user could not read an export. Called on every weight file
    drafterkit writes (checkpoints, drafters, exports) before it is renamed into place.
    """
    path = Path(path)
    mode = umask_mode()
    for f in ([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file() and not p.is_symlink())):
        if f.stat().st_mode & 0o777 != mode:
            os.chmod(f, mode)
