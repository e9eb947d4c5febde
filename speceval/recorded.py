"""Decoding settings recorded beside a drafter: ``decoding.json`` in its folder, next to ``config.json``.

``drafterkit quickstart`` writes the settings it measured its drafter with (dtype, draft trees, K, draft
thresholds), where it measured them (machine, the report's absolute path), the sha256 of the weights it
measured (``drafters.base.weights_sha256``) and the ``drafterkit eval`` commands that reproduce its rows::

    {"written_by": "drafterkit quickstart", "created": "2025-...", "report": "/abs/.../report.json",
     "dtype": "bf16", "trees": ["3,2,1,1,1"], "k": 5, "draft_thresholds": [0.1],
     "machine": {...speceval.harness.machine_info...}, "weights_sha256": "...", "commands": ["drafterkit eval ..."]}

``drafterkit export`` reads it too: the model card shows the report's measured numbers while the folder
still holds the weights of ``weights_sha256`` (``drafters.export.model_card``).

``drafterkit eval --drafter PATH`` (or ``PATH+rest`` ...) reads it: every flag of :data:`RECORDED` the
command line did not give takes the recorded value instead of eval's default (:func:`apply_recorded`);
flags given on the command line win.

``drafterkit tune`` (``speceval.tune``) adds a ``tuned`` entry (the rest of the file is kept)::

    "tuned": {"written_by": "drafterkit tune", "created": ..., "drafterkit": "0.1.0", "dtype": "fp32",
              "machine": {...machine_info, with "cpu"...}, "weights_sha256": "...", "prompts": {...}, "search": {...},
              "winners": {"1": {"tree": "dynamic:24:5:4", "k": 5, "draft_threshold": 0.05, "speedup": 1.9,
                                "tokens_per_s": ..., "tau": ...}, "4": {...}},
              "table": [{"concurrency", "rung", "batches", "label", "tree", "k", "draft_threshold",
                         "tokens_per_s", "plain_tokens_per_s", "speedup", "tau"}, ...], "plot": ".../tuning.png"}

When its machine matches the one ``drafterkit eval`` runs on (``assets.device.machine_matches``: CPU model,
core count, threads, device) and the folder still holds the weights of its ``weights_sha256``, its
batch-size-1 winner is the recorded setting (``tree``, ``k``,
``draft_threshold``, ``dtype``); otherwise the top-level fields are, and the message says why.

``drafterkit tune PATH+rest`` (``PATH+ngram``) writes the same record for the drafter behind lookup
(+ retrieval) under ``tuned+rest`` (``tuned+ngram``); ``drafterkit eval --tree auto`` and
``decode.generate(tree="auto")`` use it for those specs (``drafters.attach_tuned``).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from drafterkit.assets.device import host_info
from drafterkit.drafters import DrafterLoadError, resolve_checkpoint
from drafterkit.drafters.base import ExportError, recorded_source
from drafterkit.drafters.tuned import DECODING_FILE, LOOKUP_SUFFIXES, TUNED, tuned_key, tuned_winner
from drafterkit.speceval.eval_args import RECORDED


def write_decoding(folder: str | Path, settings: dict, *, written_by: str, **extra) -> Path:
    """Write ``folder/decoding.json``: the :data:`RECORDED` fields of ``settings`` (an ``EvalConfig``
    as a dict), ``written_by``, the time, and ``extra`` (``machine``, ``report``, ``commands``...). A
    ``tuned`` / ``tuned+rest`` / ``tuned+ngram`` entry already there (``drafterkit tune``'s, which checks its
    own weights) is kept.
    Returns its path."""
    data = dict(written_by=written_by, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                **{k: settings[k] for k in RECORDED}, **extra)
    path = Path(folder) / DECODING_FILE
    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        old = {}
    for key in (TUNED, *(tuned_key(b) for b in LOOKUP_SUFFIXES)):
        if isinstance(old, dict) and isinstance(old.get(key), dict):
            data[key] = old[key]
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


#: the tuning plot ``drafterkit tune`` writes beside ``decoding.json``
TUNE_PLOT = "tuning.png"


def drafterkit_version() -> str:
    """The installed drafterkit distribution's version (``"unknown"`` when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("drafterkit")
    except metadata.PackageNotFoundError:
        return "unknown"


def tuned_settings(data: dict, current: dict, folder: str | Path | None = None) -> tuple[dict | None, str]:
    """``(settings, why)``: the batch-size-1 winner of ``data["tuned"]`` as :data:`RECORDED` fields when its
    machine matches ``current`` (``assets.device.host_info``) and ``folder`` still holds the weights it was
    measured with, else ``None`` (``drafters.tuned.tuned_winner``); ``why`` says which and why."""
    w, why = tuned_winner(data, current, folder=folder)
    if w is None:
        return None, why
    return dict(dtype=w["dtype"], trees=[w["tree"]], k=int(w["k"]), draft_thresholds=[float(w["draft_threshold"])]), why


def write_tuned(folder: str | Path, tuned: dict, behind: str = "") -> Path:
    """Set the ``tuned`` entry of ``folder/decoding.json`` (``tuned+rest`` / ``tuned+ngram`` for the drafter
    behind lookup, ``behind``; ``drafters.tuned.tuned_key``) (the file created if missing; its other fields
    kept). Returns its path.

    Raises:
        ValueError: an existing ``decoding.json`` that is not a valid one (:func:`read_decoding`).
    """
    path = Path(folder) / DECODING_FILE
    data = read_decoding(path) if path.is_file() else {}
    data[tuned_key(behind)] = tuned
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


def no_checkpoint(spec: str) -> bool:
    """Whether a ``--drafter`` spec names no checkpoint folder (``none``, ``ngram``, ``rest``, ``suffix``, ``draft:N``,
    also behind ``+ngram`` / ``+rest`` / ``+suffix``): nothing was saved, tuned or recorded for it."""
    for suffix in LOOKUP_SUFFIXES:
        spec = spec.removesuffix(suffix)
    return spec in ("none", "ngram", "rest", "suffix") or spec.startswith("draft:")


def checkpoint_folder(spec: str) -> Path | None:
    """The drafter folder behind a ``--drafter`` spec (``PATH``, ``PATH+ngram``, ``PATH+rest``), or None."""
    if no_checkpoint(spec):
        return None
    for suffix in LOOKUP_SUFFIXES:
        spec = spec.removesuffix(suffix)
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
        "overridden" (recorded fields the command line gave), "note", "tuned" (whether its ``drafterkit
        tune`` setting was used, or why not: :func:`tuned_settings`)}``. A tuned setting measured on this
        machine is used instead of the top-level fields.

    Raises:
        ValueError: a ``decoding.json`` that is not valid (:func:`read_decoding`).
    """
    found = {}
    for spec in cfg.drafters:
        folder = checkpoint_folder(spec)
        if folder is not None and (folder / DECODING_FILE).is_file() and folder not in found:
            found[folder] = read_decoding(folder / DECODING_FILE)
    if not found:
        return None
    files = list(found)
    here = host_info(getattr(cfg, "device", "cpu"))
    effective = {}
    for f, d in found.items():
        tuned, why = tuned_settings(d, here, folder=f)
        effective[f] = (tuned or {k: d[k] for k in RECORDED if k in d}, why, tuned is not None)
    settings, tuned_why, use_tuned = effective[files[0]]
    first = found[files[0]][TUNED] if use_tuned else found[files[0]]
    mach = first.get("machine") or {}
    source = ", ".join(str(x) for x in (first.get("written_by"), mach.get("device"), mach.get("dtype"),
                                        mach.get("torch") and f"torch {mach['torch']}",
                                        mach.get("threads") and f"{mach['threads']} threads",
                                        first.get("created")) if x)
    info = dict(file=str(files[0] / DECODING_FILE), source=source, applied={}, flags="",
                overridden=sorted(k for k in settings if k in given), note="", tuned=tuned_why)
    if any({k: e[0].get(k) for k in RECORDED} != {k: settings.get(k) for k in RECORDED} for e in effective.values()):
        info["note"] = (f"the drafters' {DECODING_FILE} files record different decoding settings "
                        f"({', '.join(str(f / DECODING_FILE) for f in files)}); eval's defaults apply: give "
                        f"{', '.join(RECORDED.values())} explicitly")
        return info
    info["applied"] = {k: v for k, v in settings.items() if k not in given}
    for name, value in info["applied"].items():
        setattr(cfg, name, value)
    info["flags"] = flags_text(info["applied"])
    return info


def say_export_source(spec: str) -> None:
    """Print which training checkpoint the ``drafterkit export`` folder of a ``--drafter`` spec came from (its
    ``config.json`` records it), and whether that folder still holds the exported weights; nothing for other
    specs. ``drafterkit eval`` calls it once per spec, after ``speceval.methods.check_drafter_spec``."""
    path = Path(spec.removesuffix("+ngram").removesuffix("+rest").removesuffix("+suffix"))
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    if not isinstance(config.get("drafterkit"), dict) or "source" not in config["drafterkit"]:
        return
    try:
        print(f"--drafter {spec}: a drafterkit export of {recorded_source(path)} (the same weights)", flush=True)
    except ExportError as exc:
        print(f"--drafter {spec}: {exc}", flush=True)
