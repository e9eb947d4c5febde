"""Drafter definitions: one module per kind here (draft LM, Medusa, EAGLE, EAGLE-3, P-EAGLE, DFlash, DSpark,
n-gram, suffix), save / load; the support modules by concept in subpackages: ``heads`` (the feature-level heads'
shared parts), ``target`` (the target as a drafter reads it), ``lookup`` (model-free lookup support), ``export``
(export formats, the model card, what vLLM serves).

``KINDS`` (:mod:`drafters.kinds`) declares each kind once: its module, drafter and config classes, whether
it trains, its export formats; ``get_kind(kind)`` gives the class.
``resolve_checkpoint(path)`` turns what a user points at (a drafter folder, a training checkpoint,
a run's ``output_dir``) into the drafter folder; ``load_drafter(path, target)`` resolves, reads the
kind from ``config.json`` and loads strictly. ``eval`` and ``export`` use the same resolver.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from drafterkit.assets.records import a_or_an
from drafterkit.assets.target import read_config_dict, safetensors_problem, weights_problem
from drafterkit.drafters.base import Drafter, DrafterLoadError, ExportError, read_config, recorded_source
from drafterkit.drafters.draft_lm import DraftLM, check_vocab_match
from drafterkit.drafters.kinds import KINDS, Kind
from drafterkit.drafters.target.record import drafter_problem
from drafterkit.drafters.tuned import has_tuned, read_tuned

TRANSFORMERS_KIND = "transformers"  # resolve_checkpoint's kind for a plain transformers model folder
EXPORT_KIND = "export"  # _folder_kind's answer for a serving-engine export (config.json with a "drafterkit" block)


def get_kind(kind: str) -> type[Drafter]:
    """The drafter class for ``kind`` (its :data:`drafters.kinds.KINDS` entry). Raises ``ValueError``
    naming the valid kinds."""
    if kind not in KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}; valid kinds: {sorted(KINDS)}")
    return KINDS[kind].drafter_class()


def _has_hf_weights(path: Path) -> bool:
    return any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json")) or \
        any(path.glob("pytorch_model*.bin"))


def _folder_kind(path: Path) -> str | None:
    """``kind`` of a drafterkit drafter folder, :data:`TRANSFORMERS_KIND` for a transformers model
    folder (``config.json`` with ``model_type``, weights present), else ``None``."""
    data = read_config_dict(path) if path.is_dir() else None
    if data is None:
        return None
    if "kind" in data:
        return data["kind"] if (path / "model.safetensors").is_file() else None
    if isinstance(data.get("drafterkit"), dict):
        return EXPORT_KIND
    return TRANSFORMERS_KIND if "model_type" in data and _has_hf_weights(path) else None


def _export_format(data: dict) -> str:
    """The ``drafterkit export --format`` that wrote an export's ``config.json``."""
    block = data["drafterkit"]
    kind = KINDS.get(block["kind"]) if isinstance(block.get("kind"), str) else None  # format <engine>-<kind>
    if kind is not None and any(f == f"{f.split('-')[0]}-{kind.name}" for f in kind.exports):
        return f"{block.get('engine', 'vllm')}-{kind.name}"
    return str(block.get("kind", "unknown"))


def export_error(path: Path) -> DrafterLoadError:
    """The error for a folder written by ``drafterkit export`` (serving-engine layout): it names the
    format and points at the training checkpoint the export came from."""
    fmt = _export_format(read_config_dict(path) or {"drafterkit": {}})
    head = (f"{path} is a {fmt} export (written by `drafterkit export --format {fmt}` for serving engines such "
            "as vLLM and SGLang, with their tensor names), not a drafter checkpoint drafterkit loads. ")
    try:
        source = recorded_source(path)
        return DrafterLoadError(head + f"It was exported from {source} (same weights): evaluate or load that "
                                f"folder instead, e.g. `drafterkit eval --drafter {source}`")
    except (ExportError, OSError, ValueError) as exc:
        why = f" ({exc})" if isinstance(exc, ExportError) else ""
        return DrafterLoadError(
            head + "Evaluate or load the training checkpoint it was exported from instead, e.g. `drafterkit eval "
            f"--drafter RUN/checkpoints/last` (or RUN/checkpoints/best, or RUN itself){why}")


def _describe(path: Path) -> str:
    """What ``path`` holds, for error messages."""
    if not path.exists():
        return "nothing (no such file or folder)"
    if not path.is_dir():
        return "a file, not a folder"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not names:
        return "an empty folder"
    listing = f"{names[:12]}{' ...' if len(names) > 12 else ''}"
    if not (path / "config.json").is_file():
        return listing
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        return listing + f" (config.json is not valid JSON: {exc}; a damaged or half-written file)"
    if not isinstance(data, dict):
        return listing + " (config.json is JSON but not an object)"
    if "kind" in data:
        article = a_or_an(str(data["kind"])).split()[0]
        return listing + f" ({article} {data['kind']!r} config.json but no model.safetensors)"
    if "model_type" in data:
        return listing + f" (a transformers {data['model_type']!r} config.json" + \
            (")" if _has_hf_weights(path) else " but no weights: model.safetensors / pytorch_model.bin)")
    return listing + " (config.json has neither a drafterkit 'kind' nor a transformers 'model_type')"


def resolve_checkpoint(path: str | Path, *, allow_transformers: bool = False) -> tuple[Path, str]:
    """Find the drafter folder behind ``path``; return ``(folder, kind)``.

    Tried in order: ``path`` itself (``config.json`` with ``kind`` + ``model.safetensors``, as
    written by ``save_pretrained``); ``path/drafter`` (a training checkpoint such as
    ``OUTPUT_DIR/checkpoints/last``); ``path/checkpoints/best/drafter`` then
    ``path/checkpoints/last/drafter`` (a run's ``output_dir``). With ``allow_transformers``, a plain
    transformers causal-LM folder (``config.json`` with ``model_type``, no ``kind``) resolves too,
    with kind :data:`TRANSFORMERS_KIND`.

    Raises:
        DrafterLoadError: nothing matched (the message names what was found at ``path`` and what is
            expected), or ``path`` is a ``drafterkit export`` folder (vLLM / SGLang / Medusa layout),
            which serving engines load, not drafterkit (the message names the format and the
            checkpoint to use instead).
    """
    path = Path(path)
    for cand in (path, path / "drafter", path / "checkpoints" / "best" / "drafter",
                 path / "checkpoints" / "last" / "drafter"):
        kind = _folder_kind(cand)
        if kind == EXPORT_KIND:
            raise export_error(cand)
        if kind is not None and (kind != TRANSFORMERS_KIND or allow_transformers):
            return cand, kind
    also = " or a transformers causal-LM folder (config.json with model_type + weights)" if allow_transformers \
        else ""
    raise DrafterLoadError(
        f"{path} is not a drafter checkpoint: found {_describe(path)}. Expected a drafter folder "
        "(config.json with 'kind' + model.safetensors, as written by save_pretrained), a training checkpoint "
        "holding drafter/ (e.g. OUTPUT_DIR/checkpoints/last), or a run output_dir holding "
        f"checkpoints/best/drafter or checkpoints/last/drafter{also}")


def load_transformers_drafter(path: str | Path, target=None):
    """A transformers causal-LM folder as an independent draft model (``DraftLM``), frozen, with the
    target's dtype and device, its vocabulary checked against ``target`` (when given) before use.

    Raises:
        DrafterLoadError: torn or missing weights (``assets.target.weights_problem``), or a folder
            transformers cannot load as a causal LM.
        ValueError: the vocabularies or special token ids differ (see ``check_vocab_match``).
    """
    if problem := weights_problem(path):
        raise DrafterLoadError(f"{path} {problem}; re-save the model there (save_pretrained) or copy it again")
    p = next(target.parameters()) if target is not None else None
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=p.dtype if p is not None else torch.float32)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DrafterLoadError(f"{path}: transformers cannot load it as a causal LM ({first})") from None
    if p is not None:
        model.to(p.device)
        check_vocab_match(target, model, what=f"draft model {path}")
    model.eval().requires_grad_(False)
    return DraftLM.from_model(model).eval()


def load_drafter(path: str | Path, target=None, *, trained_for: bool = True) -> Drafter:
    """Load a drafter from ``path`` (anything :func:`resolve_checkpoint` accepts, including a plain
    transformers causal-LM folder, loaded as an independent draft model); ``target`` supplies
    modules borrowed from it, and the drafter takes its device and floating dtype (measured: an
    EAGLE-3 head drafts in 6.8 ms per round in bf16 next to a bf16 SmolLM2-135M, 13.3 ms in fp32).
    The drafter carries the setting ``drafterkit tune`` measured best on this machine, if any, as
    ``tuned_decoding`` (``{"tree", "k", "draft_threshold", ...}`` or None) and ``tuned_note`` (why):
    ``decode.generate(..., tree="auto")`` uses it (:mod:`drafters.tuned`).

    With ``trained_for`` (the default) and a ``target`` loaded from a folder or Hub id (its ``name_or_path``),
    a feature-level head whose training recipe records another target gets the warning line the CLI prints
    (``warnings.warn``, ``UserWarning``; :func:`drafters.target.record.drafter_problem`); the CLI's verbs, which
    said it before loading, pass False.

    Raises:
        DrafterLoadError: ``path`` holds no drafter (the message says what it holds), is a
            ``drafterkit export`` folder (the message says which checkpoint to load instead), a torn
            or partial weights file, a tensor mismatch, or (``trained_for``) a head trained for a target whose
            tokenizer maps tokens to other ids than ``target``'s.
    """
    folder, kind = resolve_checkpoint(path, allow_transformers=True)
    name = getattr(target, "name_or_path", None) if trained_for else None
    if name and (line := drafter_problem(folder, kind, str(name), flag="a target loaded from")):
        warnings.warn(line, UserWarning, stacklevel=2)
    if kind == TRANSFORMERS_KIND:
        return attach_tuned(load_transformers_drafter(folder, target), folder, target)
    if problem := safetensors_problem(folder / "model.safetensors"):
        raise DrafterLoadError(f"{folder / 'model.safetensors'} {problem}; save the drafter again (or copy the "
                               "checkpoint again)")
    drafter = get_kind(kind).from_pretrained(folder, target=target)
    if target is not None:  # decode in the target's dtype: an fp32 head next to a bf16 target drafts ~2x slower
        p = next(target.parameters())
        drafter.to(device=p.device, dtype=p.dtype)
    return attach_tuned(drafter, folder, target)


def attach_tuned(proposer, folder: str | Path, target=None, behind: str = ""):
    """Attach ``tuned_decoding`` / ``tuned_note`` (:func:`drafters.tuned.read_tuned` for this machine) to
    ``proposer`` and return it: the drafter of ``folder`` alone (``behind=""``), or that drafter behind prompt
    lookup (``"+ngram"``) or lookup + retrieval (``"+rest"``, a ``drafters.lookup.hybrid.LookupHybrid`` wrapping it).
    A composite that ``drafterkit tune`` never measured takes its inner drafter's setting (and says so); one
    it measured takes its own entry, usable or not (a composite whose best was slower than plain decoding
    is not decoded in the drafter's shape instead)."""
    device = next(target.parameters()).device if target is not None else "auto"
    inner = getattr(proposer, "drafter", None)
    if behind and not has_tuned(folder, behind) and inner is not None and hasattr(inner, "tuned_decoding"):
        proposer.tuned_decoding = inner.tuned_decoding
        proposer.tuned_note = f"the drafter's own tuned setting (PATH{behind} was not tuned: {inner.tuned_note})"
        return proposer
    proposer.tuned_decoding, proposer.tuned_note = read_tuned(folder, device, behind)
    return proposer


__all__ = [
    "KINDS",
    "Kind",
    "attach_tuned",
    "TRANSFORMERS_KIND",
    "Drafter",
    "DrafterLoadError",
    "get_kind",
    "load_drafter",
    "load_transformers_drafter",
    "read_config",
    "resolve_checkpoint",
]
