"""The decoding shape ``drafterkit tune`` chose for a model-free proposer (prompt lookup ``ngram``, prompt lookup
+ retrieval ``rest``, suffix decoding ``suffix``), kept per target under ``$DRAFTERKIT_HOME/tuned``.

A checkpoint's tuned setting lives in its folder's ``decoding.json``, tied to its weights (``weights_sha256``,
:mod:`drafters.tuned`). A model-free proposer has no folder and no weights; what its best chain / tree / K
depends on is the target it drafts for (how often that target's answers repeat their prompt or the corpus),
the dtype (what a verification pass costs against a plain step), the machine, and the proposer's own knobs and
corpus (retrieval's datastore, suffix decoding's global tree over ``--datastore``). So its record is kept at::

    $DRAFTERKIT_HOME/tuned/<model_type>-<target key>/<kind>-<proposer key>.<dtype>.json

* ``target key`` (:func:`target_identity`): sha256 of the target's config (dtype fields left out) and of
  every parameter's name, shape and 4,096 values spread over it, rounded to bf16, so the same weights loaded
  in fp32 or bf16 have one key (the dtype is the file's own part) and a fine-tune or another model another;
* ``proposer key`` (:func:`proposer_key`): sha256 of the proposer's knobs (``NGramConfig``, ``SuffixConfig``,
  ``LookupHybrid.settings``) and of its corpus's token stream, so another corpus or other knobs are another record;
* ``dtype``: the target's parameter dtype (``float32``, ``bfloat16``...).

A record is used only under the rules a checkpoint's is (:func:`drafters.tuned.tuned_winner`): measured on
this machine (CPU model, cores, torch threads, device) and faster than plain decoding; a record for the same
target and proposer in another dtype, or for the same target with another corpus or other knobs, is not
used, and the note says so (:func:`read_free_tuned`). ``drafterkit eval --tree auto`` further refuses a
setting measured in the other exact mode (``speceval.methods.tuned_row``), as it does for checkpoints.

:func:`attach_free_tuned` sets ``tuned_decoding`` / ``tuned_note`` on a proposer as ``drafters.load_drafter``
does for a checkpoint, which is how ``decode.generate(..., tree="auto")`` finds the setting::

    d = attach_free_tuned(NGramDrafter(), target)
    out = generate(target, ids, drafter=d, tree="auto", max_new_tokens=128)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from drafterkit.assets.device import host_info
from drafterkit.assets.pinned import home
from drafterkit.drafters.tuned import NO_TUNED, TUNED, tuned_winner

#: the ``--drafter`` / ``drafterkit tune`` specs of model-free proposers whose tuned shape is kept here
FREE_SPECS = ("ngram", "rest", "suffix")
#: a proposer's ``kind`` -> its spec (``rest``: prompt lookup + retrieval, ``drafters.lookup.hybrid.LookupHybrid``
#: around an ``NGramDrafter``, whose kind names both)
_SPEC_OF_KIND = {"ngram": "ngram", "ngram+rest": "rest", "suffix": "suffix"}
#: values read per parameter by :func:`target_identity`
SAMPLED = 4096
_DTYPE_KEYS = ("torch_dtype", "dtype", "transformers_version")


def _config_fields(config) -> dict:
    """The target config as a dict without its dtype, version and private (``_``) fields, recursively."""
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if k not in _DTYPE_KEYS and not str(k).startswith("_")}
        return d
    return strip(config.to_dict())


def target_identity(target: torch.nn.Module) -> str:
    """``<model_type>-<16 hex>``: the target as the tuned records of model-free proposers know it. The hash
    covers the config (dtype fields left out) and every parameter's name, shape and :data:`SAMPLED` values
    spread evenly over it, rounded to bf16: the same weights loaded in fp32 or bf16 give the same identity,
    another model or a fine-tune that moves the sampled values another. (fp16 loads of fp32 weights may round
    some values twice and then differ: the record is then not found, never misapplied.)"""
    h = hashlib.sha256(json.dumps(_config_fields(target.config), sort_keys=True, default=str).encode())
    for name, p in target.named_parameters():
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // SAMPLED)][:SAMPLED]
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(sample.float().to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
    kind = getattr(target.config, "model_type", None) or "target"
    return f"{kind}-{h.hexdigest()[:16]}"


def _corpus_sha(corpus) -> str | None:
    """sha256 of a corpus's token stream (``drafters.lookup.suffix_tree.CorpusSuffixIndex`` or a ``Datastore``),
    kept on the object (its tokens never change)."""
    if corpus is None:
        return None
    cached = getattr(corpus, "_drafterkit_sha256", None)
    if cached is None:
        cached = hashlib.sha256(np.ascontiguousarray(corpus.tokens, dtype=np.int32).tobytes()).hexdigest()
        corpus._drafterkit_sha256 = cached
    return cached


def _fields(proposer) -> dict:
    config = getattr(proposer, "config", None)
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    if callable(getattr(proposer, "settings", None)):  # LookupHybrid's retrieval knobs
        fields["settings"] = proposer.settings()
    return fields


def proposer_key(proposer) -> str:
    """12 hex of sha256 over ``proposer``'s knobs (its config fields, ``settings()``, and those of the proposer
    it wraps) and its corpus's tokens (``corpus`` for suffix decoding, ``datastore`` for retrieval; none for
    prompt lookup)."""
    inner = getattr(proposer, "drafter", None)
    corpus = getattr(proposer, "corpus", None) or getattr(proposer, "datastore", None)
    blob = json.dumps(dict(fields=_fields(proposer), inner=_fields(inner) if inner is not None else None,
                           corpus=_corpus_sha(corpus)), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _kind(proposer) -> str:
    kind = getattr(proposer, "kind", None)
    if kind not in _SPEC_OF_KIND:
        raise ValueError(f"tuned records under $DRAFTERKIT_HOME/tuned are for the model-free proposers "
                         f"{', '.join(FREE_SPECS)}; got {kind or type(proposer).__name__} (a checkpoint keeps its "
                         "own in its folder's decoding.json)")
    return _SPEC_OF_KIND[kind]


def _dtype_name(target) -> str:
    return str(next(target.parameters()).dtype).removeprefix("torch.")


def record_path(target, proposer) -> Path:
    """Where the tuned record of ``proposer`` (an ``NGramDrafter``, a ``LookupHybrid`` around one with a datastore,
    or a ``SuffixDrafter``) for ``target`` in its
    current dtype is kept (module docstring).

    Raises:
        ValueError: ``proposer`` is not one of :data:`FREE_SPECS`."""
    kind = _kind(proposer)
    return home() / "tuned" / target_identity(target) / f"{kind}-{proposer_key(proposer)}.{_dtype_name(target)}.json"


def write_free_tuned(target, proposer, record: dict) -> Path:
    """Write ``record`` (``drafterkit tune``'s, the format of a ``decoding.json`` ``tuned`` entry) as the tuned
    setting of ``proposer`` for ``target`` in its dtype, with the identities it is keyed by; returns its path.

    Raises:
        ValueError: ``proposer`` is not one of :data:`FREE_SPECS`."""
    path = record_path(target, proposer)
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = getattr(proposer, "corpus", None)
    record = dict(record, target_identity=target_identity(target), proposer_key=proposer_key(proposer),
                  target_dtype=_dtype_name(target),
                  corpus_sha256=_corpus_sha(corpus), file=str(path))
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def read_free_tuned(target, proposer, device=None) -> tuple[dict | None, str]:
    """``(winner, why)`` for ``proposer`` drafting for ``target`` on this machine: the batch-size-1 winner of
    its record (:func:`drafters.tuned.tuned_winner`'s rules: this machine, faster than plain decoding), else
    ``None`` and why: no record, one for this target in another dtype, or one with another corpus / other
    knobs. ``device``: where the target runs (default: its parameters' device). Never raises on a missing or
    unreadable record."""
    kind = _kind(proposer)
    path = record_path(target, proposer)
    device = device if device is not None else next(target.parameters()).device
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return None, f"{path} is not readable JSON ({exc}): tune again"
        return tuned_winner({TUNED: data}, host_info(device))
    here, dtype = path.parent, _dtype_name(target)
    others = sorted(here.glob(f"{kind}-*.json")) if here.is_dir() else []
    same = [p for p in others if p.name.startswith(f"{kind}-{proposer_key(proposer)}.")]
    if same:
        recorded = sorted(p.name.split(".")[-2] for p in same)
        return None, (f"its tuned setting was measured in {' and '.join(recorded)} and the target runs in {dtype} "
                      f"here: give --dtype {_short(recorded[0])}, or tune again in this dtype")
    if others:
        return None, (f"{NO_TUNED} for {kind} with this corpus and these knobs on this target ({path.name}); the one "
                      f"recorded ({others[0].name}) was measured with another --datastore or other settings: give "
                      f"the --datastore it was tuned with, or run drafterkit tune {kind} with this one")
    return None, (f"{NO_TUNED} for {kind} on this target in {dtype} (run drafterkit tune {kind} with the same "
                  f"--target, --dtype{'' if kind == 'ngram' else ' and --datastore'})")


def _short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def attach_free_tuned(proposer, target, device=None):
    """Attach ``tuned_decoding`` / ``tuned_note`` (:func:`read_free_tuned`) to ``proposer`` (an ``NGramDrafter``,
    a ``LookupHybrid`` around one with a datastore, or a ``SuffixDrafter``) and return it, as
    ``drafters.load_drafter`` does for a checkpoint: ``decode.generate(..., tree="auto")`` then decodes in the
    recorded shape.

    Raises:
        ValueError: ``proposer`` is not one of :data:`FREE_SPECS`."""
    proposer.tuned_decoding, proposer.tuned_note = read_free_tuned(target, proposer, device)
    return proposer


__all__ = ["FREE_SPECS", "attach_free_tuned", "proposer_key", "read_free_tuned", "record_path", "target_identity",
           "write_free_tuned"]
