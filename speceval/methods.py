"""What ``drafterkit eval`` compares: drafter specs (``PATH`` | ``ngram`` | ``suffix`` | ``draft:N`` |
``SPEC+ngram`` | ``SPEC+rest`` | ``SPEC+suffix`` | ``none``) built into drafters, and the methods that produce an
answer with them:
``decode.generate`` with and without a drafter, ``target.generate`` and transformers' own speculative path.

A method's ``call(rows, seed, max_new)`` returns ``(sequences, wall_s, stats)``: the new tokens per row,
the seconds of the whole call on one wall-clock stopwatch, and the engine's stats as a dict
(:func:`stats_record`; ``None`` for transformers' paths).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from drafterkit import decode
from drafterkit.assets.device import resolve_dtype
from drafterkit.assets.records import did_you_mean
from drafterkit.assets.target import safetensors_problem
from drafterkit.decode.dynamic_tree import parse_tree
from drafterkit.decode.exact import exact_mode_enabled
from drafterkit.decode.inputs import AUTO
from drafterkit.drafters import (
    TRANSFORMERS_KIND,
    DrafterLoadError,
    attach_tuned,
    load_drafter,
    resolve_checkpoint,
)
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.kinds import max_draft_tokens
from drafterkit.drafters.lookup.hybrid import LookupHybrid, drafts_trees
from drafterkit.drafters.lookup.suffix_hybrid import SuffixHybrid
from drafterkit.drafters.lookup.tuned_free import FREE_SPECS, attach_free_tuned
from drafterkit.drafters.ngram import NGramDrafter
from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter, corpus_index
from drafterkit.drafters.tuned import LOOKUP_SUFFIXES
from drafterkit.speceval.eval_args import drafter_spec_forms
from drafterkit.speceval.shape_checks import distinct_trees, refuse_trees, serves_alone, serves_chain


@dataclass
class DrafterSpec:
    """A drafter to measure: ``label`` (table name), the object passed to ``decode.generate``, and the
    kwargs of transformers' own equivalent (``None``: it has none). ``"{k}"`` in a kwarg is K."""

    label: str
    drafter: Any
    hf_kwargs: dict | None
    tree: str | None = None  # a decode.tree.DraftTree spec: measured with tree drafts instead of chains
    k: int | None = None  # this row's chain K (a ``--tree auto`` row: the tuned K); None: eval's --k
    # a checkpoint's short name in ``label`` (``run/best``) and its folder: drafters whose short names
    # collide (two quickstart runs are both ``train/best``) get longer path suffixes (:func:`build_drafters`)
    short_name: str | None = None
    folder: str | None = None
    max_k: int | None = None  # the most draft tokens its drafter proposes a round (Medusa's heads, DFlash's block)


@dataclass
class Method:
    """One way of producing the answer; ``call(rows, seed, max_new) -> (sequences, wall_s, stats)``."""

    method: str
    role: str  # plain | spec | hf | hf-assisted
    drafter: str
    k: int
    call: Callable = field(repr=False)

    def meta(self) -> dict:
        return dict(method=self.method, role=self.role, drafter=self.drafter, k=self.k)



def check_drafter_spec(spec: str, flag: str = "--drafter") -> None:
    """Check a ``--drafter`` spec (see :func:`build_drafter`) without loading anything: its syntax (``+ngram`` /
    ``+rest`` suffixes, ``draft:N``) and, for a path, that it holds a drafter (``drafters.resolve_checkpoint``
    reads only its ``config.json``). ``drafterkit eval`` runs it before loading the target. ``flag``: how the
    messages name where the spec came from (``--drafter`` for eval, ``tune`` for ``drafterkit tune PATH``).

    Raises:
        ValueError: the spec is malformed or its path holds no drafter (the message says what it holds and
            the fix).
    """
    if spec in ("none", "ngram", "rest", "suffix"):
        return
    alone = "--drafter ngram" if flag.startswith("--") else f"drafterkit {flag} ngram"  # lookup alone
    for suffix in LOOKUP_SUFFIXES:
        if not spec.endswith(suffix):
            continue
        inner = spec[: -len(suffix)]
        if inner.endswith(LOOKUP_SUFFIXES):
            raise ValueError(f"{flag} {spec}: give one of +ngram, +rest or +suffix ('+rest' already includes prompt "
                             "lookup): PATH+ngram, PATH+rest or PATH+suffix")
        if inner in ("", "none", "ngram", "rest", "suffix"):
            what = {"+rest": "prompt lookup and retrieval", "+suffix": "suffix decoding"}.get(suffix, "prompt lookup")
            free = "prompt lookup"
            if suffix != "+ngram":
                free, name = ("suffix decoding", "suffix") if suffix == "+suffix" else ("lookup + retrieval", "rest")
                alone = f"--drafter {name}" if flag.startswith("--") else f"drafterkit {flag} {name}"
            raise ValueError(f"{flag} {spec}: '{suffix}' puts {what} "
                             f"in front of a trained drafter: PATH{suffix} or draft:N{suffix} (for {free} "
                             f"alone use {alone})")
        return check_drafter_spec(inner, flag)
    for prefix in ("ngram+", "rest+", "suffix+"):
        if spec.startswith(prefix):
            raise ValueError(f"{flag} {spec}: write the drafter first and the lookup second: "
                             f"{spec[len(prefix):]}+{prefix[:-1]}")
    tail = spec.rsplit("+", 1)[-1] if "+" in spec else None
    if tail is not None and "/" not in tail and not Path(spec).exists():
        hint = (" (a threshold is not part of the spec: --draft-threshold T labels the row SPEC@T)"
                if "@" in tail else "")
        hint += did_you_mean(tail, ("ngram", "rest", "suffix"), prefix="+")
        raise ValueError(f"{flag} {spec}: unknown suffix '+{tail}'; valid: PATH+ngram, PATH+rest, PATH+suffix{hint}")
    if spec.startswith("draft:"):
        if not spec.split(":", 1)[1].isdigit() or int(spec.split(":", 1)[1]) < 1:
            raise ValueError(f"{flag} {spec}: N must be an int >= 1 (layers of the target kept)")
        return
    try:
        folder, kind = resolve_checkpoint(spec, allow_transformers=True)
    except DrafterLoadError as exc:
        hint = "" if "/" in spec or Path(spec).exists() else did_you_mean(spec, ("ngram", "rest", "suffix", "none"))
        if Path(spec).is_dir():  # a folder meant as a checkpoint: what is wrong with it comes first
            raise ValueError(f"{flag} {spec}: {exc}") from None
        raise ValueError(f"{flag} {spec}{hint}: not {drafter_spec_forms()}. {exc}") from None
    weights = folder / "model.safetensors"  # torn: said first, not after notes that read the file (a tuned setting)
    if kind != TRANSFORMERS_KIND and weights.is_file() and (problem := safetensors_problem(weights)):
        raise ValueError(f"{flag} {spec}: {weights} {problem}; save the drafter again (or copy the checkpoint again)")


def build_drafter(spec: str, target, datastore=None, flag: str = "--drafter") -> DrafterSpec | None:
    """``none`` -> None; ``ngram`` -> prompt lookup; ``draft:N`` -> the target truncated to N layers;
    ``SPEC+ngram`` -> SPEC's drafter behind prompt lookup (``drafters.lookup.hybrid.LookupHybrid``: rows whose
    last 2+ tokens occurred before copy what followed, the rest use the drafter); ``SPEC+rest`` -> the
    same plus retrieval from a corpus datastore (REST) for the rows without a prompt match, the
    corpus's continuations merged into SPEC's tree (``datastore``: a zero-argument callable returning
    the ``drafters.lookup.datastore.Datastore``, called once per ``+rest`` spec); ``suffix`` -> suffix decoding
    (:func:`suffix_drafter`: prompt trees plus the datastore's corpus); ``SPEC+suffix`` -> SPEC's drafter
    behind it (``drafters.lookup.suffix_hybrid.SuffixHybrid``: the suffix draft where its score reaches the draft
    length, else the drafter's);
    anything else -> a path resolved by ``drafters.resolve_checkpoint``: a drafter folder, a training
    checkpoint (``.../checkpoints/best``), a run ``output_dir``, or a plain transformers causal-LM
    folder (e.g. an ``hf-assistant`` export, any small LM sharing the target's tokenizer), loaded
    frozen with the target's dtype and device as an independent draft model. ``flag``: as in
    :func:`check_drafter_spec`.

    Raises:
        ValueError: a malformed spec (:func:`check_drafter_spec`), ``draft:N`` with more layers than the
            target's, a draft model whose vocabulary does not match the target's (checked here, before any
            token is generated), or ``+rest`` without a ``datastore``.
    """
    check_drafter_spec(spec, flag)
    if spec == "none":
        return None
    for suffix in LOOKUP_SUFFIXES:
        if not spec.endswith(suffix):
            continue
        if suffix == "+rest" and datastore is None:
            raise ValueError(f"{flag} {spec}: '+rest' needs a datastore (drafterkit eval --datastore SOURCE)")
        base = build_drafter(spec[: -len(suffix)], target, datastore, flag)
        if suffix == "+suffix":
            hybrid = SuffixHybrid(base.drafter, suffix_drafter(datastore))
        else:
            hybrid = LookupHybrid(base.drafter, datastore=datastore() if suffix == "+rest" else None)
        if base.folder:  # its own `drafterkit tune PATH+rest` setting, else the drafter's (tree="auto", --tree auto)
            attach_tuned(hybrid, base.folder, target, behind=suffix)
        return dataclasses.replace(base, label=f"{base.label}{suffix}", drafter=hybrid, hf_kwargs=None, max_k=None)
    if spec == "suffix":  # model-free: its `drafterkit tune suffix` setting for this target (tree="auto")
        return DrafterSpec("suffix", attach_free_tuned(suffix_drafter(datastore), target), None)
    if spec == "rest":  # prompt lookup, else the datastore's continuations (REST), no trained drafter behind
        if datastore is None:
            raise ValueError(f"{flag} rest: retrieval needs a datastore (drafterkit eval --datastore SOURCE)")
        return DrafterSpec("rest", attach_free_tuned(LookupHybrid(NGramDrafter(), datastore=datastore()), target), None)
    if spec == "ngram":
        d = attach_free_tuned(NGramDrafter(), target)
        return DrafterSpec("ngram", d, {"prompt_lookup_num_tokens": "{k}",
                                        "max_matching_ngram_size": d.config.max_ngram})
    if spec.startswith("draft:"):
        n, layers = int(spec.split(":", 1)[1]), target.config.num_hidden_layers
        if not 1 <= n <= layers:
            raise ValueError(f"{flag} {spec}: N must be an int in [1, {layers}] (layers of the target kept)")
        d = DraftLM.from_target(target, n)
        return DrafterSpec(spec, d, _assistant_kwargs(d))
    return _load_checkpoint(spec, target, flag)


#: the corpus suffix indexes built so far, by datastore (one per eval however many suffix rows read it)
_CORPUS_INDEXES: dict[int, Any] = {}


def suffix_drafter(datastore=None) -> SuffixDrafter:
    """Suffix decoding as ``drafterkit eval`` measures it (``suffix`` and ``SPEC+suffix``): vLLM's knobs, its
    global tree over ``datastore``'s corpus (a zero-argument callable returning a
    ``drafters.lookup.datastore.Datastore``,
    the ``+rest`` rows' corpus; None: no corpus) and NOT over the outputs of the run
    (``max_cached_requests=0``): eval decodes the warm-up prompt twice and every prompt once per method, so
    cached outputs would hand a method the answer it is about to produce."""
    corpus = None
    if datastore is not None:
        store = datastore()
        if id(store) not in _CORPUS_INDEXES:
            _CORPUS_INDEXES[id(store)] = corpus_index(store, SuffixConfig.max_tree_depth,
                                                      log=lambda m: print(m, flush=True))
        corpus = _CORPUS_INDEXES[id(store)]
    return SuffixDrafter(SuffixConfig(max_cached_requests=0), corpus=corpus)


def retrieval_info(specs: list[DrafterSpec]) -> dict | None:
    """What a reader needs to reproduce the ``+rest`` rows of ``specs``: ``{"datastore": {"source",
    "path", "tokens", "vocab_size", "min_ngram", "max_ngram"} (drafters.lookup.datastore.Datastore.describe),
    "drafters": {label: {"datastore_share", "datastore_matches", "datastore_depth", "max_ngram",
    "min_match"}}}`` (``LookupHybrid.settings``); ``None`` when no spec retrieves from a datastore.
    ``drafterkit eval`` loads one datastore for all its ``+rest`` specs; should they hold several,
    ``datastore`` is a list of them, in spec order."""
    rest = [s for s in specs if getattr(s.drafter, "datastore", None) is not None]
    if not rest:
        return None
    stores = list({id(s.drafter.datastore): s.drafter.datastore for s in rest}.values())
    described = [d.describe() for d in stores]
    return dict(datastore=described[0] if len(described) == 1 else described,
                drafters={s.label: s.drafter.settings() for s in rest})


def suffix_info(specs: list[DrafterSpec]) -> dict | None:
    """The settings of the suffix-decoding rows of ``specs`` (``suffix``, ``SPEC+suffix``): ``{label: {the
    drafters.suffix.SuffixConfig fields, "corpus_tokens", and for SPEC+suffix "min_score"}}``; None without any."""
    rows = {s.label: s.drafter.settings() for s in specs if isinstance(s.drafter, (SuffixDrafter, SuffixHybrid))}
    return rows or None


def _assistant_kwargs(d) -> dict:
    # Same job as the engine: a constant K draft tokens per round, no early stop on low confidence.
    return {"assistant_model": d.lm, "num_assistant_tokens": "{k}", "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


def _load_checkpoint(spec: str, target, flag: str = "--drafter") -> DrafterSpec:
    path, kind = resolve_checkpoint(spec, allow_transformers=True)  # checked by check_drafter_spec
    try:
        # a transformers folder: vocabulary checked against target; another trained-for target: said by the verb
        d = load_drafter(path, target=target, trained_for=False)
    except ValueError as exc:
        raise ValueError(f"{flag} {spec}: {exc}") from None
    p = next(target.parameters())
    d.to(device=p.device, dtype=p.dtype)
    name = path.parent.name if path.name == "drafter" else path.name
    if path.name == "drafter" and path.parent.parent.name == "checkpoints":  # <run>/checkpoints/best/drafter
        name = f"{path.parent.parent.parent.name}/{name}"
    label = f"hf:{name}" if kind == TRANSFORMERS_KIND else f"{d.kind}:{name}"
    return DrafterSpec(label, d, _assistant_kwargs(d) if isinstance(d, DraftLM) else None, short_name=name,
                       folder=str(path.resolve()), max_k=max_draft_tokens(d.kind, vars(d.config)))


def _cut_at_eos(ids: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def stats_record(res) -> dict:
    """A ``GenerateResult``'s stats as a dict, plus ``reached_per_position`` (raw counts, so
    ``decode.metrics.pool_stats`` pools per-position acceptance exactly across calls)."""
    return dict(dataclasses.asdict(res.stats), reached_per_position=list(res.counts.reached) if res.counts else None)


def engine_method(target, spec: DrafterSpec | None, k: int, sampling: dict, eos: list[int]) -> Method:
    """A ``decode.generate`` method: plain (``spec is None``) or speculative with ``spec``'s drafter."""
    drafter = spec.drafter if spec else None
    if spec is not None and spec.k is not None:
        k = spec.k
    if spec is not None and spec.max_k is not None:  # a larger K would draft no more tokens: the row says so
        k = min(k, spec.max_k)
    k_call = max(k, 1)  # ignored by plain decoding, must still be a valid K

    def call(rows, seed, max_new):
        t0 = time.perf_counter()
        res = decode.generate(target, rows, drafter=drafter, max_new_tokens=max_new, num_draft_tokens=k_call,
                              tree=spec.tree if spec else None, eos_token_id=eos, seed=seed, **sampling)
        wall = time.perf_counter() - t0
        return res.sequences, wall, stats_record(res)

    if spec is None:
        return Method("engine", "plain", "none", 0, call)
    if spec.tree is not None:  # K is the tree's depth: the most draft tokens one pass can accept
        k = parse_tree(spec.tree).max_depth
    return Method(spec.label, "spec", spec.label, k, call)


class _DropInternalGenerateDeprecation:
    """``logging.Filter`` for the deprecation transformers' own assisted generation triggers (its
    assistant's ``generate`` gets ``generation_config`` plus ``max_new_tokens``): not our call."""

    def filter(self, record) -> bool:
        return "Passing `generation_config` together with generation-related" not in record.getMessage()


@contextmanager
def _quiet_internal_deprecation():
    log, flt = logging.getLogger("transformers.generation.utils"), _DropInternalGenerateDeprecation()
    log.addFilter(flt)
    try:
        yield
    finally:
        log.removeFilter(flt)


def hf_generation_config(target, sampling: dict, eos: list[int], pad: int, max_new: int, extra: dict):
    """A copy of the target's ``GenerationConfig`` with every field of the call set (sampling params,
    ``max_new_tokens``, EOS, pad, the speculative fields of ``extra``), passed to ``generate`` ALONE:
    transformers deprecates mixing a config object with generation kwargs."""
    from transformers import GenerationConfig

    base = getattr(target, "generation_config", None)
    gc = copy.deepcopy(base) if base is not None else GenerationConfig()
    if sampling["temperature"] > 0:
        fields = dict(do_sample=True, temperature=sampling["temperature"], top_k=sampling["top_k"],
                      top_p=sampling["top_p"])
    else:  # unset sampling fields so greedy does not warn about ignored temperature / top-p
        fields = dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    gc.update(**fields, max_new_tokens=max_new, min_new_tokens=0, eos_token_id=list(eos), pad_token_id=pad,
              **{k: v for k, v in extra.items() if k != "assistant_model"})
    return gc


def hf_method(target, spec: DrafterSpec | None, k: int, sampling: dict, eos: list[int], pad: int) -> Method:
    """``target.generate`` (``spec is None``) or transformers' speculative path for ``spec`` (batch 1)."""
    extra = {key: (k if v == "{k}" else v) for key, v in (spec.hf_kwargs or {}).items()} if spec else {}
    model_kw = {"assistant_model": extra["assistant_model"]} if "assistant_model" in extra else {}

    def call(rows, seed, max_new):
        if len(rows) != 1:
            raise ValueError("the transformers baselines run one prompt at a time (batch 1)")
        dev = next(target.parameters()).device
        ids = torch.tensor(rows, dtype=torch.long, device=dev)
        gc = hf_generation_config(target, sampling, eos, pad, max_new, extra)
        if seed is not None:
            torch.manual_seed(seed)
        t0 = time.perf_counter()
        with torch.no_grad(), _quiet_internal_deprecation():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc, **model_kw)
        wall = time.perf_counter() - t0
        return [_cut_at_eos(out[0, ids.shape[1]:].tolist(), eos)], wall, None

    if spec is None:
        return Method("hf", "hf", "none", 0, call)
    return Method(f"{spec.label} [hf-assisted]", "hf-assisted", spec.label, k, call)


def build_methods(target, specs: list[DrafterSpec], k: int, sampling: dict, eos: list[int], pad: int,
                  baselines: list[str]) -> list[Method]:
    """Spec methods for every drafter, then the requested baselines (``engine``, ``hf``, ``hf-assisted``)."""
    methods = [engine_method(target, s, k, sampling, eos) for s in specs]
    if "engine" in baselines:
        methods.append(engine_method(target, None, k, sampling, eos))
    if "hf" in baselines:
        methods.append(hf_method(target, None, k, sampling, eos, pad))
    if "hf-assisted" in baselines:
        methods += [hf_method(target, s, k, sampling, eos, pad) for s in specs if s.hf_kwargs is not None]
    return methods


def build_drafters(names: list[str], target, thresholds: list[float], trees: list[str] | None = None,
                   datastore=None, served: bool = False) -> list:
    """:func:`build_drafter` for each spec; a drafter that supports a confidence-based draft length
    (``drafters.base.ChainCutoff``) is measured once per threshold, labelled ``<label>@<threshold>`` when
    the threshold is not 0, and one that can propose trees once per entry of ``trees`` (``"chain"`` or a
    ``decode.tree.DraftTree`` spec), labelled ``<label> tree=<spec>`` (one fresh load each, so the rows
    are independent). ``"auto"`` in ``trees`` adds one row per checkpoint with its tuned setting
    (:func:`tuned_row`, not crossed with ``thresholds``); given alone, the specs that are no checkpoint
    are measured as chains. A chain-only drafter (DFlash) given a tree raises ``ValueError``
    (``speceval.shape_checks.refuse_trees``). The same drafter given twice is
    numbered on its name, before the threshold and tree: ``eagle3:run/best#2@0.1 tree=3,2,1``. With ``served``,
    a checkpoint alone (no ``+rest`` / ``+ngram`` / ``+suffix``) measured in no chain without a threshold also gets
    that row, labelled by its name alone: the chain of K a serving engine drafts (vLLM's ``num_speculative_tokens``)."""
    built: list[tuple] = []  # (spec labelled by its drafter name only, "@thr tree=..." suffix)
    trees = distinct_trees(trees or ["chain"])
    tuned, trees = AUTO in trees, [t for t in trees if t != AUTO]
    for name in names:
        row = tuned_row(name, target, datastore) if tuned else None
        if row is not None:
            built.append(row)
        shapes = trees or ([] if row else ["chain"])  # `--tree auto` alone: the others as a chain of --k
        for thr in thresholds if shapes else []:
            first = build_drafter(name, target, datastore)
            if first is None:
                break
            variants = shapes if drafts_trees(first.drafter) else refuse_trees(name, first.drafter, shapes)
            for j, tree in enumerate(variants):
                s, suffix = (first if j == 0 else build_drafter(name, target, datastore)), ""
                if getattr(s.drafter, "supports_draft_threshold", False):
                    s.drafter.draft_threshold = float(thr)
                    if thr > 0:
                        s, suffix = dataclasses.replace(s, hf_kwargs=None), f"@{thr:g}"
                if tree != "chain":
                    s, suffix = dataclasses.replace(s, hf_kwargs=None, tree=tree), f"{suffix} tree={tree}"
                built.append((s, suffix))
            if not getattr(first.drafter, "supports_draft_threshold", False):
                break
        if served and serves_alone(name) and not serves_chain(row, shapes, thresholds):
            s = build_drafter(name, target, datastore)  # the chain of K an engine serves: no threshold
            if s is not None and s.folder:
                if getattr(s.drafter, "supports_draft_threshold", False):
                    s.drafter.draft_threshold = 0.0
                built.append((s, ""))
    # checkpoints whose short names collide (two quickstart runs are both `train/best`) are named by the
    # shortest path suffix that tells them apart
    folders: dict[str, set] = {}
    for s, _ in built:
        if s.short_name:
            folders.setdefault(s.short_name, set()).add(s.folder)
    for short, group in folders.items():
        if len(group) < 2:
            continue
        names = _distinct_suffixes(sorted(group))
        built = [(dataclasses.replace(s, label=s.label.replace(f":{short}", f":{names[s.folder]}", 1))
                  if s.short_name == short else s, suffix) for s, suffix in built]
    # what still collides (the same folder or spec twice) gets its own row: the n-th copy is `<name>#n<suffix>`
    specs, taken = [], set()
    for s, suffix in built:
        label, n = f"{s.label}{suffix}", 1
        while label in taken:
            n += 1
            label = f"{s.label}#{n}{suffix}"
        taken.add(label)
        specs.append(dataclasses.replace(s, label=label))
    return specs


def tuned_row(name: str, target, datastore=None) -> tuple[DrafterSpec, str] | None:
    """The ``--tree auto`` row of drafter spec ``name``: its checkpoint's ``drafterkit tune`` winner at
    batch size 1 (``tuned_decoding``, which ``drafters.load_drafter`` attaches: chain or tree, K, confidence
    threshold), the setting
    ``decode.generate(tree="auto")`` uses; a ``+ngram`` / ``+rest`` spec takes the setting ``drafterkit tune
    PATH+rest`` recorded for it, or its drafter's when none was (``drafters.attach_tuned``); ``ngram`` and
    ``suffix`` take the one ``drafterkit tune ngram`` / ``suffix`` recorded for this target, dtype and corpus
    (``drafters.lookup.tuned_free``), under the same rules. Returns
    ``(spec, suffix)`` as :func:`build_drafters` collects them, the suffix ``"@<thr> (tuned) tree=<spec>"``
    (no ``tree=`` for a chain, whose K the row carries); ``None`` for a spec with nothing to tune (``none``,
    ``draft:N``).

    Raises:
        ValueError: the spec has no tuned setting usable here (none recorded, another machine, weights,
            dtype, corpus or knobs, no setting beat plain decoding), or one measured in another dtype than the
            target's or in the other exact mode (``decode.exact_mode``) than this eval's; the message says
            why and the fix.
    """
    s = build_drafter(name, target, datastore)
    if s is None or (not s.folder and name not in FREE_SPECS):
        return None
    p = next(target.parameters())
    # drafters.load_drafter (the drafter) and build_drafter (PATH+rest, PATH+ngram) attached the setting tuned
    # for the target's device
    winner = getattr(s.drafter, "tuned_decoding", None)
    why = getattr(s.drafter, "tuned_note", None) or f"no tuned setting for {s.folder}"
    if winner is None:
        raise ValueError(f"--tree auto: --drafter {name}: {why}")
    if resolve_dtype(winner.get("dtype", "fp32")) != p.dtype:
        raise ValueError(f"--tree auto: --drafter {name}: its tuned setting was measured in {winner.get('dtype')} and "
                         f"this eval runs the target in {str(p.dtype).removeprefix('torch.')}: give --dtype "
                         f"{winner.get('dtype')}, or tune again in this dtype")
    if winner.get("exact_mode") is not None and bool(winner["exact_mode"]) != exact_mode_enabled():
        fix = "drop --no-exact" if winner["exact_mode"] else "give --no-exact"
        raise ValueError(f"--tree auto: --drafter {name}: its tuned setting was measured "
                         f"{'in the decoder exact mode' if winner['exact_mode'] else 'with --no-exact'} and this "
                         f"eval runs {'with --no-exact' if winner['exact_mode'] else 'in exact mode'}: {fix}, or "
                         "tune again in this mode")
    thr, tree = float(winner["draft_threshold"]), None if winner["tree"] == "chain" else winner["tree"]
    suffix = ""
    if getattr(s.drafter, "supports_draft_threshold", False):
        s.drafter.draft_threshold = thr
        suffix = f"@{thr:g}" if thr > 0 else ""
    suffix += " (tuned)" + (f" tree={tree}" if tree else "")
    return dataclasses.replace(s, hf_kwargs=None, tree=tree, k=int(winner["k"])), suffix


def _distinct_suffixes(folders: list[str]) -> dict[str, str]:
    """``{folder: its shortest trailing path that no other folder shares}`` (``checkpoints`` / ``drafter``
    components left out: ``runs/qs7/train/checkpoints/best/drafter`` -> ``qs7/train/best``)."""
    parts = {f: [c for c in Path(f).parts if c not in ("checkpoints", "drafter")] for f in folders}
    for n in range(1, max(len(p) for p in parts.values()) + 1):
        names = {f: "/".join(p[-n:]) for f, p in parts.items()}
        if len(set(names.values())) == len(names):
            return names
    return {f: f for f in folders}
