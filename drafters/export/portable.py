"""Paths as an export may hold them: ``drafterkit export`` folders are uploaded as they are (``hf upload``,
``--push-to-hub``), so no file in them names a folder of the machine that wrote them.

* :func:`shown_path`: a path as the model card shows it (relative to the working folder, else the tail that names
  it: ``run/checkpoints/best/drafter``, a folder's name), never absolute;
* :func:`source_link`: the drafter folder an export came from, as ``config.json`` records it (relative to the
  export folder, or nothing where that relative path would name the machine's folders);
* :func:`scrubbed`: a recipe or a command line with every absolute path in it shown by :func:`shown_path`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any


def _under(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def shown_path(path: str | Path) -> str:
    """``path`` as an export may name it: as given when relative; relative to the working folder when under it;
    else the drafter folder of a training checkpoint as ``RUN/checkpoints/NAME/drafter`` (``RUN``: the run
    folder's name), anything else by its name. Never absolute, never the home folder."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    p = Path(os.path.normpath(p))
    cwd = Path.cwd()
    if _under(p, cwd) and cwd != Path(cwd.anchor):
        return str(p.relative_to(cwd)) if p != cwd else "."
    parts = p.parts[1:]
    if len(parts) >= 4 and parts[-3] == "checkpoints":  # RUN/checkpoints/NAME/drafter
        return "/".join(parts[-4:])
    if len(parts) >= 3 and parts[-2] == "checkpoints":  # RUN/checkpoints/NAME
        return "/".join(parts[-3:])
    return p.name or "."


def source_link(ckpt: Path, out: Path) -> str | None:
    """The drafter folder ``ckpt`` relative to the export folder ``out`` (``../runs/eagle3/checkpoints/best/drafter``),
    what ``config.json`` records for ``drafterkit serve-check`` to find it; None when the two share no folder
    below the root, or when the relative path would climb to the root or through the home folder (it would then
    name the machine's folders: ``../../home/USER/...``)."""
    ckpt, out = ckpt.resolve(), out.resolve()
    common = Path(os.path.commonpath([ckpt, out]))
    home = Path.home().resolve()
    if common == Path(common.anchor) or (common in home.parents and _under(ckpt, home)):
        return None
    return os.path.relpath(ckpt, out)


def _looks_absolute(value: str) -> bool:
    return value.startswith("/") and not value.startswith("//") and "\n" not in value and " " not in value


def _shown_arg(arg: str) -> str:
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("-") and _looks_absolute(value):
        return f"{flag}={shown_path(value)}"
    if _looks_absolute(arg):
        return shown_path(arg)
    if "+" in arg and _looks_absolute(arg.split("+")[0]):  # a drafter spec PATH+rest
        head, _, tail = arg.partition("+")
        return f"{shown_path(head)}+{tail}"
    return arg


def scrubbed(value: Any) -> Any:
    """``value`` (a recipe as a dict, a list, a string) with every absolute path in it shown by :func:`shown_path`;
    a string holding a command line (``drafterkit eval --drafter /abs/... ``) has each such argument replaced."""
    if isinstance(value, dict):
        return {k: scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    if not isinstance(value, str):
        return value
    if _looks_absolute(value):
        return shown_path(value)
    if " " in value and "/" in value:
        try:
            args = shlex.split(value)
        except ValueError:
            return value
        shown = [_shown_arg(a) for a in args]
        return shlex.join(shown) if shown != args else value
    return value
