"""What every drafter kind shares: config (de)serialisation and strict safetensors save/load.

A drafter kind is one module in ``drafters/`` defining

* a config dataclass (JSON-serialisable fields only),
* an ``nn.Module`` subclass of :class:`Drafter` with ``forward`` for training and ``propose`` for the
  decoder (the protocol in ``decode/protocol.py``),
* its :class:`drafters.kinds.Kind` entry in ``drafters.kinds.KINDS`` (kind name -> what every layer reads of it).

Checkpoints are a folder with ``config.json`` (``{"kind": ..., "config": {...}}``) and
``model.safetensors`` holding only the drafter's OWN trainable tensors and buffers; modules borrowed
frozen from the target (embeddings, LM head) are not saved and are re-attached from the target at
load time. Loading is strict: a missing or unexpected tensor raises, never silently re-initialises.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from drafterkit.assets.file_modes import apply_umask


class DrafterLoadError(RuntimeError):
    """A checkpoint folder does not match the drafter it is loaded into."""


class Checked:
    """An attribute checked on every assignment (``__init__``'s and any later one): ``ok(value)`` must
    hold (a bool is never accepted), else ``ValueError(message)``, formatted with ``{name}`` (the
    attribute) and ``{value!r}``; ``convert`` maps accepted values (e.g. ``float``); ``default`` is read
    before the first assignment (none: ``AttributeError``).

    Raises:
        ValueError: on assignment of a value ``ok`` refuses (the message names the attribute and value).
    """

    _NONE = object()

    def __init__(self, ok, message: str, *, convert=None, default: Any = _NONE):
        self.ok, self.message, self.convert, self.default = ok, message, convert, default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        if self.default is Checked._NONE:
            raise AttributeError(self.name)
        return self.default

    def __set__(self, obj: Any, value: Any) -> None:
        if isinstance(value, bool) or not self.ok(value):
            raise ValueError(self.message.format(name=self.name, value=value))
        obj.__dict__[self.name] = self.convert(value) if self.convert else value


def _probability_bar(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


#: what a drafter's ``expand_threshold`` takes
_BAR = "{name} must be a finite number >= 0 (a probability bar; 0 disables it), got {value!r}"


def _confidence_bar(value: Any) -> bool:
    return _probability_bar(value) and value < 1


#: what a drafter's ``draft_threshold`` takes
_CONFIDENCE = "{name} must be in [0, 1) (a path-probability bar; 0 disables it; at 1 nothing is drafted), got {value!r}"


class Drafter(nn.Module):
    """Base class for drafter kinds.

    Subclasses set ``kind`` and ``config_class``, build their modules in ``__init__(config, target=None)``,
    and implement ``propose`` (see ``decode.protocol.Proposer``). ``borrowed_prefixes`` names
    state-dict prefixes taken frozen from the target (excluded from checkpoints).
    """

    kind: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    borrowed_prefixes: ClassVar[tuple[str, ...]] = ()
    feature_layers: tuple[int, ...] | None = None
    #: Confidence-based draft length (see :class:`ChainCutoff`): a chain stops once the product of the
    #: drafter's own probabilities of its tokens falls below this, and a tree node whose path
    #: probability does is not proposed (``propose_tree``). 0.0 (default): always ``k`` tokens / the
    #: full tree. A decode-time setting, not saved in checkpoints; set it on the loaded drafter (a value
    #: outside [0, 1) raises ValueError: at 1 or above nothing would ever be drafted, as ``drafterkit eval``
    #: refuses it too).
    draft_threshold = Checked(_confidence_bar, _CONFIDENCE, convert=float, default=0.0)
    #: In trees drafted level by level (draft LM, EAGLE, EAGLE-3), a node gets children only when its
    #: path probability is also >= this; a node between ``draft_threshold`` and it is verified as a leaf,
    #: costing verification but no further drafter pass (Medusa, whose heads draft every depth at once,
    #: cuts the children of such nodes the same way). 0.0 (default): ``draft_threshold`` alone decides;
    #: above 1: no node gets children. ``drafters.lookup.hybrid.LookupHybrid`` with a datastore raises it to its
    #: ``datastore_share`` for its calls. A decode-time setting, checked like ``draft_threshold``.
    expand_threshold = Checked(_probability_bar, _BAR, convert=float, default=0.0)

    @property
    def expand_bar(self) -> float:
        """The path probability a tree node needs to get children: ``max(draft_threshold,
        expand_threshold)`` (every tree-drafting kind reads it from here)."""
        return max(self.draft_threshold, self.expand_threshold)
    #: True for kinds whose ``propose`` honours ``draft_threshold`` (draft LM, Medusa, EAGLE, EAGLE-3).
    supports_draft_threshold: ClassVar[bool] = False

    def __init__(self, config: Any):
        super().__init__()
        self.config = config

    # --- decoder protocol defaults -------------------------------------------------------------
    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        tv = target.get_output_embeddings().weight.shape[0]
        mine = getattr(self.config, "vocab_size", None)
        if mine is not None and mine != tv:
            raise ValueError(f"{self.kind} drafter has vocab_size {mine} but the target's LM head has {tv} "
                             "rows; train the drafter for this target (same tokenizer)")

    def reset(self, batch_size: int) -> None:
        pass

    # --- save / load -----------------------------------------------------------------------------
    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """State dict without tensors borrowed from the target; contiguous, detached copies."""
        return {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()
                if not k.startswith(self.borrowed_prefixes)}

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``path`` (created). Returns ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config) else dict(self.config)
        (path / "config.json").write_text(json.dumps({"kind": self.kind, "config": cfg}, indent=2))
        save_tensors(self.own_state_dict(), path / "model.safetensors", metadata={"kind": self.kind})
        return path

    def load_own_state_dict(self, state: dict[str, torch.Tensor], source: str = "") -> None:
        """Strictly load ``state`` into the drafter's own (non-borrowed) tensors.

        Raises:
            DrafterLoadError: listing missing and unexpected tensor names, or a shape mismatch.
        """
        problem = tensor_mismatch(self.own_shapes(state.keys()), {k: tuple(v.shape) for k, v in state.items()})
        if problem:
            raise DrafterLoadError(f"{self.kind} checkpoint {source} does not match: {problem}")
        self.load_state_dict(state, strict=False)

    def own_shapes(self, held: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor a checkpoint of this drafter must hold (borrowed ones excluded);
        ``held``: the names a checkpoint holds, for kinds with tensors a checkpoint may omit."""
        return {k: tuple(v.shape) for k, v in self.state_dict().items() if not k.startswith(self.borrowed_prefixes)}

    @classmethod
    def config_at(cls, path: str | Path) -> Any:
        """The config of the checkpoint folder ``path``, checked to be of this kind.

        Raises:
            DrafterLoadError: no checkpoint there, another kind, or a config this version refuses (the
                message says why and the fix).
        """
        kind, cfg = read_config(path)
        if kind != cls.kind:
            raise DrafterLoadError(f"{path} holds a drafter of kind {kind!r}, not {cls.kind!r}")
        try:
            return cls.config_class(**cfg)
        except TypeError as exc:  # a field this kind does not have, or one it needs missing: not this kind's config
            why = str(exc).split("() ", 1)[-1]  # "got an unexpected keyword argument 'x'", "missing 1 required ..."
            raise DrafterLoadError(f"{path}/config.json does not describe a drafter of kind {cls.kind!r}, though its "
                                   f"\"kind\" says so ({why}): the kind or a field was edited, or the file comes from "
                                   "another drafter's save; copy the checkpoint folder again as a whole, or save the "
                                   "drafter again") from None
        except ValueError as exc:  # e.g. an EAGLE-3 layer id no engine serves
            raise DrafterLoadError(f"{path}/config.json: {exc}") from None

    @classmethod
    def check_weights(cls, path: str | Path, config: Any = None) -> None:
        """Check that ``path/model.safetensors`` holds exactly the tensors, of exactly the shapes, that
        ``path/config.json`` implies, reading only the file's header (the drafter is built on the meta
        device, beside a stand-in for the target's embedding and LM head of the config's ``vocab_size`` x
        ``hidden_size``): a config edited, or copied from another save, is named as such here rather than
        blamed on the target or found by the engine that serves an export.

        Raises:
            DrafterLoadError: the two files disagree (the first differences named), the weights file cannot
                be read, or the config is refused (see :meth:`config_at`).
        """
        config = cls.config_at(path) if config is None else config
        with torch.device("meta"):
            skeleton = cls(config, target=_BorrowedShapes.of(config))
        found = weight_shapes(path)
        problem = tensor_mismatch(skeleton.own_shapes(found.keys()), found)
        if problem:
            raise DrafterLoadError(f"{Path(path) / 'model.safetensors'} does not match {Path(path) / 'config.json'}: "
                                   f"{problem}. The two files come from different saves (or one was edited): copy "
                                   "the checkpoint folder again as a whole, or save the drafter again")

    @classmethod
    def from_pretrained(cls, path: str | Path, target: nn.Module | None = None, **kw) -> "Drafter":
        """Load a checkpoint written by ``save_pretrained``; ``target`` supplies borrowed modules.

        Raises:
            DrafterLoadError: another kind, a config this version refuses (the message says why and the
                fix), weights that do not match the config (:meth:`check_weights`), or a damaged file.
        """
        path = Path(path)
        config = cls.config_at(path)
        cls.check_weights(path, config)
        drafter = cls(config, target=target, **kw)
        drafter.load_own_state_dict(read_weights(path), source=str(path))
        return drafter.eval()


class _BorrowedShapes(nn.Module):
    """What a drafter borrows from its target (input embedding, LM head), shaped ``vocab_size`` x
    ``hidden_size`` from a drafter config: with ``torch.device("meta")``, a drafter's skeleton is built
    without the target and without memory."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    @classmethod
    def of(cls, config: Any) -> "_BorrowedShapes | None":
        vocab, hidden = getattr(config, "vocab_size", None), getattr(config, "hidden_size", None)
        return cls(vocab, hidden) if isinstance(vocab, int) and isinstance(hidden, int) else None

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def tensor_mismatch(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str | None:
    """How the tensors ``found`` (name -> shape) differ from those ``expected``, in words, or None."""
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        return (f"missing tensors {missing[:8]}{left_out(missing, 8)}, "
                f"unexpected tensors {unexpected[:8]}{left_out(unexpected, 8)}")
    wrong = [f"{k} has shape {found[k]}, expected {expected[k]}" for k in sorted(expected) if found[k] != expected[k]]
    if wrong:
        return "tensor " + "; ".join(wrong[:4]) + left_out(wrong, 4)
    return None


def left_out(items: list, shown: int) -> str:
    """``" (and N more)"`` for the ``items`` past the first ``shown``, else ``""``."""
    return f" (and {len(items) - shown} more)" if len(items) > shown else ""


def weight_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each tensor in ``folder/model.safetensors``, from its header alone.

    Raises:
        DrafterLoadError: the file cannot be read (damaged or cut short), naming it and the fix."""
    file = Path(folder) / "model.safetensors"
    try:
        with safe_open(str(file), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise unreadable(file, exc) from None


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/model.safetensors``.

    Raises:
        DrafterLoadError: the file cannot be read (damaged or cut short), naming it and the fix."""
    file = Path(folder) / "model.safetensors"
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise unreadable(file, exc) from None


def nonfinite_tensors(folder: str | Path) -> list[str]:
    """Names of the floating-point tensors of ``folder/model.safetensors`` holding a NaN or an infinity (a
    diverged run saves such weights). Raises ``DrafterLoadError`` as :func:`read_weights`."""
    return [k for k, v in read_weights(folder).items() if v.is_floating_point() and not torch.isfinite(v).all()]


def unreadable(file: Path, exc: Exception) -> DrafterLoadError:
    """The one-line error for a weights file safetensors cannot read, naming it and the fix."""
    return DrafterLoadError(f"{file} cannot be read ({exc}): the file is damaged or cut short (an interrupted save "
                            "or copy?); save or copy the checkpoint again")


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` with the umask-derived file mode (see :func:`apply_umask`)."""
    save_file(tensors, str(path), metadata=metadata)
    apply_umask(path)


def weights_sha256(folder: str | Path) -> str:
    """The sha256 (hex) of ``folder/model.safetensors``: which weights a record (``decoding.json``, an export's
    ``drafterkit.source``) was written for. Raises ``OSError`` when the file cannot be read."""
    digest = hashlib.sha256()
    with open(Path(folder) / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_config(path: str | Path) -> tuple[str, dict]:
    """Read ``(kind, config dict)`` from a drafter checkpoint folder.

    Raises:
        DrafterLoadError: no ``config.json``/``model.safetensors`` there, a ``config.json`` that is not
            JSON, or no ``kind`` in it.
    """
    path = Path(path)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise DrafterLoadError(f"{path} is not a drafter checkpoint (needs config.json and "
                               "model.safetensors, as written by save_pretrained)")
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8-sig"))
    except ValueError as exc:
        raise DrafterLoadError(f"{path}/config.json is not valid JSON ({exc}): a damaged or half-written file; "
                               "restore it, or save the drafter again") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise DrafterLoadError(f"{path}/config.json has no 'kind'; it was not written by drafterkit")
    return data["kind"], data.get("config", {})


def card_head(cfg: dict, layers: str) -> tuple[str, str]:
    """The two facts a head kind's model-card line (``drafters.kinds.Kind.card_line``) states, read from its
    ``config.json`` config ``cfg``: its layers and the target layers it reads (``"2 draft layer(s), target layers
    [3, 15, 27]"``; ``layers`` names its layers) and its vocabulary (``"draft vocabulary 512 of 49152 target
    tokens"``)."""
    return (f"{int(cfg.get('num_layers', 1))} {layers} layer(s), target layers {cfg.get('feature_layers')}",
            f"draft vocabulary {cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')} target tokens")


class ExportError(ValueError):
    """The checkpoint cannot be exported in the requested format; the message says why and the fix."""


def recorded_source(export_dir: str | Path) -> Path:
    """The drafter folder an export was written from (:func:`drafters.export.writers.record_source`: relative to the
    export folder, absolute in older exports), absolute, checked to still hold the same weights.

    Raises:
        ExportError: the export records no source (written by an older drafterkit, or an ``hf-assistant``
            export), the recorded folder is gone, or its ``model.safetensors`` no longer has the recorded
            sha256 (retrained or replaced since); each message names the folder and the fix.
    """
    config = json.loads((Path(export_dir) / "config.json").read_text())
    block = config.get("drafterkit")
    source = block.get("source") if isinstance(block, dict) else None  # a hand-edited config may hold anything
    if isinstance(source, dict) and source.get("drafter") is None and isinstance(source.get("model_sha256"), str):
        raise ExportError(f"{export_dir}/config.json does not record where its drafter folder is (an export names "
                          "no machine path, and it was written outside the folder tree holding the drafter): name "
                          "the drafter folder it was exported from")
    if not isinstance(source, dict) or not isinstance(source.get("drafter"), str) \
            or not isinstance(source.get("model_sha256"), str):
        raise ExportError(f"{export_dir}/config.json records no source drafter folder (exported by an older "
                          "drafterkit): export it again, or name the folder it was exported from")
    # relative to the export folder (drafters.export.portable.source_link); an older export recorded it absolute
    folder = Path(os.path.normpath(Path(export_dir).resolve() / source["drafter"]))
    try:
        digest = weights_sha256(folder)
    except OSError:
        raise ExportError(f"{export_dir} was exported from {folder}, which is gone (no readable "
                          "model.safetensors there): name the drafter folder it was exported from") from None
    if digest != source["model_sha256"]:
        raise ExportError(f"{export_dir} was exported from {folder}, whose model.safetensors has changed since "
                          f"(sha256 {digest[:12]}..., recorded {source['model_sha256'][:12]}...): export it again "
                          "from the current weights, or name the folder holding the exported ones")
    return folder
