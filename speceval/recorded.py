"""Decoding settings recorded beside a drafter: ``decoding.json`` in its folder, next to ``config.json``.

``drafterkit quickstart`` writes the settings it measured its drafter with (dtype, draft trees, K, draft
thresholds), where it measured them (machine, the report's absolute path), the sha256 of the weights it
measured (``drafters.base.weights_sha256``) and the ``drafterkit eval`` commands that reproduce its rows::

    {"written_by": "drafterkit quickstart", "created": "2025-...", "report": "/abs/.../report.json",
     "dtype": "bf16", "trees": ["3,2,1,1,1"], "k": 5, "draft_thresholds": [0.1],
     "machine": {...speceval.harness.machine_info...}, "weights_sha256": "...", "commands": ["drafterkit eval ..."]}

``drafterkit export`` reads it too: the model card shows the report's measured numbers while the folder
still holds the weights of ``weights_sha256`` (``drafters.model_card``).

``drafterkit eval --drafter PATH`` (or ``PATH+rest`` ...) reads it: every flag of :data:`RECORDED` the
command line did not give takes the recorded value instead of eval's default (:func:`apply_recorded`);
flags given on the command line win.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from drafters import DrafterLoadError, resolve_checkpoint

DECODING_FILE = "decoding.json"
#: ``EvalConfig`` field -> its ``drafterkit eval`` flag: the settings a ``decoding.json`` records
RECORDED = {"dtype": "--dtype", "trees": "--tree", "k": "--k", "draft_thresholds": "--draft-threshold"}


def write_decoding(folder: str | Path, settings: dict, *, written_by: str, **extra) -> Path:
    """Write ``folder/decoding.json``: the :data:`RECORDED` fields of ``settings`` (an ``EvalConfig``
    as a dict), ``written_by``, the time, and ``extra`` (``machine``, ``report``, ``commands``...).
    Returns its path."""
    data = dict(written_by=written_by, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                **{k: settings[k] for k in RECORDED}, **extra)
    path = Path(folder) / DECODING_FILE
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def read_decoding(path: Path) -> dict:
    """The recorded fields of one ``decoding.json`` (those of :data:`RECORDED` it holds), type-checked.

    Raises:
        ValueError: not a JSON object, or a recorded field of the wrong type (names the file and the fix).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({exc}); fix or delete it, or give "
                         f"{', '.join(RECORDED.values())} explicitly") from None
    kinds = {"dtype": str, "trees": list, "k": int, "draft_thresholds": list}
    if not isinstance(data, dict) or any(k in data and not isinstance(data[k], t) for k, t in kinds.items()):
        raise ValueError(f"{path}: expected a JSON object with dtype (str), trees (list), k (int) and "
                         "draft_thresholds (list); fix or delete it")
    return data


def _folder_of(spec: str) -> Path | None:
    """The drafter folder behind a ``--drafter`` spec (``PATH``, ``PATH+ngram``, ``PATH+rest``), or None."""
    for suffix in ("+ngram", "+rest"):
        spec = spec.removesuffix(suffix)
    if spec in ("none", "ngram") or spec.startswith("draft:"):
        return None
    try:
        return resolve_checkpoint(spec)[0]
    except DrafterLoadError:
        return None  # building the drafter reports it


def flags_text(values: dict) -> str:
    """``--dtype bf16 --tree 3,2,1,1,1 --k 5 --draft-threshold 0.1`` of recorded ``values``."""
    parts = []
    for name, value in values.items():
        if name == "trees":
            parts += [f"--tree {t}" for t in value]
        else:
            parts.append(f"{RECORDED[name]} {','.join(f'{v:g}' for v in value) if isinstance(value, list) else value}")
    return " ".join(parts)


def apply_recorded(cfg, given: set[str]) -> dict | None:
    """Set the fields of ``cfg`` (an ``EvalConfig``) that ``given`` (field names set on the command line)
    leaves out to the values of its drafters' ``decoding.json``.

    Only when every drafter of ``cfg`` that has a ``decoding.json`` records the same settings: drafters
    recording different ones leave ``cfg`` as it is (the returned ``applied`` is empty and ``note`` says why).

    Returns:
        ``None`` when no drafter has a ``decoding.json``; else ``{"file", "source" (who wrote it, where,
        when), "applied" ({field: value} taken from it), "flags" (:func:`flags_text` of ``applied``),
        "overridden" (recorded fields the command line gave), "note"}``.

    Raises:
        ValueError: a ``decoding.json`` that is not valid (:func:`read_decoding`).
    """
    found = {}
    for spec in cfg.drafters:
        folder = _folder_of(spec)
        if folder is not None and (folder / DECODING_FILE).is_file() and folder not in found:
            found[folder] = read_decoding(folder / DECODING_FILE)
    if not found:
        return None
    files = list(found)
    first = found[files[0]]
    settings = {k: first[k] for k in RECORDED if k in first}
    mach = first.get("machine") or {}
    source = ", ".join(str(x) for x in (first.get("written_by"), mach.get("device"), mach.get("dtype"),
                                        mach.get("torch") and f"torch {mach['torch']}",
                                        mach.get("threads") and f"{mach['threads']} threads",
                                        first.get("created")) if x)
    info = dict(file=str(files[0] / DECODING_FILE), source=source, applied={}, flags="",
                overridden=sorted(k for k in settings if k in given), note="")
    if any({k: d.get(k) for k in RECORDED} != {k: first.get(k) for k in RECORDED} for d in found.values()):
        info["note"] = (f"the drafters' {DECODING_FILE} files record different decoding settings "
                        f"({', '.join(str(f / DECODING_FILE) for f in files)}); eval's defaults apply: give "
                        f"{', '.join(RECORDED.values())} explicitly")
        return info
    info["applied"] = {k: v for k, v in settings.items() if k not in given}
    for name, value in info["applied"].items():
        setattr(cfg, name, value)
    info["flags"] = flags_text(info["applied"])
    return info
