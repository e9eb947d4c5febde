"""The measuring parts of ``drafterkit eval`` (``speceval.bench``): eval prompts, drafter specs, the
methods compared (speculative engine, plain engine, ``target.generate``, transformers' own
speculative path), and the interleaved measurement loops (eval, K x temperature sweep, concurrency).

Every method is timed with the same wall-clock stopwatch around its whole call; a run dict per
(prompt or batch, method) holds the new tokens, the seconds and the engine's ``DecodeStats``
(``None`` for transformers' paths). ``speceval.report`` pools runs into rows.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import platform
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import decode
from assets import conversations as P
from assets.pinned import fetch
from decode.tree import DraftTree
from drafters import TRANSFORMERS_KIND, DrafterLoadError, load_drafter, resolve_checkpoint
from drafters.draft_lm import DraftLM
from drafters.hybrid import LookupHybrid
from drafters.ngram import NGramDrafter

BENCHMARKS = ("mt-bench", "humaneval", "sharegpt")
BASELINES = ("engine", "hf", "hf-assisted")
HUMANEVAL_REQUEST = ("Complete the following Python function. Reply with the completed code only.\n\n"
                     "```python\n{prompt}```")
WARMUP_TOKENS = 4


@dataclass
class Prompt:
    """One eval prompt: ``input_ids`` is the chat-templated prompt (``list[int]``, ends where the
    assistant's answer starts)."""

    id: str
    category: str
    messages: list[dict]
    input_ids: list[int]


@dataclass
class DrafterSpec:
    """A drafter to measure: ``label`` (table name), the object passed to ``decode.generate``, and the
    kwargs of transformers' own equivalent (``None``: it has none). ``"{k}"`` in a kwarg is K."""

    label: str
    drafter: Any
    hf_kwargs: dict | None
    tree: str | None = None  # a decode.tree.DraftTree spec: measured with tree drafts instead of chains
    # a checkpoint's short name in ``label`` (``run/best``) and its folder: drafters whose short names
    # collide (two quickstart runs are both ``train/best``) get longer path suffixes (speceval.bench)
    short_name: str | None = None
    folder: str | None = None


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


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

def _balanced(items: list[dict], n: int) -> list[dict]:
    """``n`` items taken round-robin over their ``category`` (file order), so a small ``n`` still
    covers every workload (MT-bench: n = 8 gives one question per category)."""
    by_cat: dict[str, list[dict]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    out, i = [], 0
    while len(out) < min(n, len(items)):
        for rows in by_cat.values():
            if i < len(rows) and len(out) < n:
                out.append(rows[i])
        i += 1
    return out


def chat_ids(tok, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ending at the generation
    prompt; a tokenizer without a template gets the contents joined by blank lines."""
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok("\n\n".join(m["content"] for m in messages))["input_ids"])


@dataclass
class PromptSelection:
    """What :func:`select_prompts` chose: ``prompts`` (at most the number asked) and ``skipped``, one
    ``{"id", "tokens", "reason"}`` per prompt passed over because it is too long (never cut)."""

    prompts: list[Prompt]
    skipped: list[dict]


def load_prompts(benchmark: str, tok, num_prompts: int, *, max_prompt_tokens: int = 2048,
                 heldout_seed: int = 0) -> list[Prompt]:
    """The prompts of :func:`select_prompts` (what ``drafterkit eval`` measures); same arguments and errors."""
    return select_prompts(benchmark, tok, num_prompts, max_prompt_tokens=max_prompt_tokens,
                          heldout_seed=heldout_seed).prompts


def select_prompts(benchmark: str, tok, num_prompts: int, *, max_prompt_tokens: int = 2048,
                   limit_name: str = "--max-prompt-tokens", heldout_seed: int = 0,
                   heldout_source: str | Path | None = None, heldout_fraction: float | None = None
                   ) -> PromptSelection:
    """Eval prompts for ``benchmark`` (``mt-bench`` first turns balanced over its 8 categories,
    ``humaneval`` (category ``code``), ``sharegpt`` held-out first turns, or a ``.jsonl`` file read
    by ``assets.conversations.load_prompts_jsonl``), chat-templated with ``tok`` (:func:`chat_ids`).

    The ONE function that turns a benchmark into token ids, for ``drafterkit eval`` and for training's
    own evaluation (``train.evaluate.eval_prompt_ids``). A prompt longer than ``max_prompt_tokens`` is
    skipped whole (never truncated), recorded in ``skipped`` with its reason, and the next one is taken.
    Fewer usable prompts than ``num_prompts`` (a short JSONL file) is not an error: all of them are
    used, with a ``UserWarning`` saying how many.

    Args:
        max_prompt_tokens: the longest prompt kept, in tokens; ``limit_name`` says where that limit
            comes from, in the skip reason and the error.
        heldout_seed, heldout_source, heldout_fraction: the held-out split ``sharegpt`` draws from
            (``assets.conversations.heldout_prompts``): split seed, file (default the pinned ShareGPT asset)
            and fraction (default ``assets.conversations.HELDOUT_FRACTION``); 4 x ``num_prompts`` candidates.

    Raises:
        ValueError: unknown benchmark, ``num_prompts < 1``, or no usable prompt at all.
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if benchmark == "mt-bench":
        items = [dict(id=f"mt-bench/{q['question_id']}", category=q["category"],
                      messages=[{"role": "user", "content": q["turns"][0]}]) for q in P.load_mt_bench()]
    elif benchmark == "humaneval":
        items = [dict(id=p["task_id"], category="code",
                      messages=[{"role": "user", "content": HUMANEVAL_REQUEST.format(prompt=p["prompt"])}])
                 for p in P.load_humaneval()]
    elif benchmark == "sharegpt":
        fraction = P.HELDOUT_FRACTION if heldout_fraction is None else heldout_fraction
        source = heldout_source or fetch("sharegpt")
        msgs = P.heldout_prompts(source, 4 * num_prompts, seed=heldout_seed, fraction=fraction, strict=False)
        if not msgs:
            raise ValueError(f"sharegpt: no held-out conversation in {source} at held-out fraction {fraction} "
                             f"(split seed {heldout_seed}); raise the fraction")
        items = [dict(id=f"sharegpt/{i}", category="sharegpt", messages=m) for i, m in enumerate(msgs)]
    elif benchmark.endswith((".jsonl", ".jsonl.gz")) or Path(benchmark).is_file():
        if not Path(benchmark).is_file():
            raise ValueError(f"--benchmark {benchmark}: no such file")
        items = [dict(id=f"{Path(benchmark).name}/{i}", category=Path(benchmark).stem, messages=m)
                 for i, m in enumerate(P.load_prompts_jsonl(benchmark))]
    else:
        raise ValueError(f"unknown --benchmark {benchmark!r}; use one of {', '.join(BENCHMARKS)} or a .jsonl "
                         "file of {\"prompt\": ...} / {\"messages\": [...]} lines")
    out, skipped = [], []
    reason = f"longer than {max_prompt_tokens} tokens ({limit_name})"
    for it in _balanced(items, len(items)):
        ids = chat_ids(tok, it["messages"])
        if len(ids) <= max_prompt_tokens:
            out.append(Prompt(it["id"], it["category"], it["messages"], ids))
        else:
            skipped.append(dict(id=it["id"], tokens=len(ids), reason=reason))
        if len(out) == num_prompts:
            return PromptSelection(out, skipped)
    if not out:
        raise ValueError(f"{benchmark}: no prompt of at most {max_prompt_tokens} tokens among {len(items)}; "
                         f"raise {limit_name}")
    warnings.warn(f"{benchmark}: using {len(out)} prompts, fewer than the {num_prompts} asked (--num-prompts): "
                  f"{len(items)} in the benchmark" + (f", {len(skipped)} {reason}" if skipped else ""),
                  stacklevel=3)
    return PromptSelection(out, skipped)


# ---------------------------------------------------------------------------------------------
# Drafters and methods
# ---------------------------------------------------------------------------------------------

def build_drafter(spec: str, target, datastore=None) -> DrafterSpec | None:
    """``none`` -> None; ``ngram`` -> prompt lookup; ``draft:N`` -> the target truncated to N layers;
    ``SPEC+ngram`` -> SPEC's drafter behind prompt lookup (``drafters.hybrid.LookupHybrid``: rows whose
    last 2+ tokens occurred before copy what followed, the rest use the drafter); ``SPEC+rest`` -> the
    same plus retrieval from a corpus datastore (REST) for the rows without a prompt match, the
    corpus's continuations merged into SPEC's tree (``datastore``: a zero-argument callable returning
    the ``drafters.datastore.Datastore``, called once per ``+rest`` spec);
    anything else -> a path resolved by ``drafters.resolve_checkpoint``: a drafter folder, a training
    checkpoint (``.../checkpoints/best``), a run ``output_dir``, or a plain transformers causal-LM
    folder (e.g. an ``hf-assistant`` export, any small LM sharing the target's tokenizer), loaded
    frozen with the target's dtype and device as an independent draft model.

    Raises:
        ValueError: a malformed ``draft:N``, a path holding no drafter (the message says what it
            holds), a draft model whose vocabulary does not match the target's (checked here,
            before any token is generated), or ``+rest`` without a ``datastore``.
    """
    if spec == "none":
        return None
    for suffix in ("+ngram", "+rest"):
        if not spec.endswith(suffix):
            continue
        inner = spec[: -len(suffix)]
        if inner.endswith(("+ngram", "+rest")):
            raise ValueError(f"--drafter {spec}: give one of +ngram or +rest ('+rest' already includes prompt "
                             "lookup): PATH+ngram or PATH+rest")
        if inner in ("", "none", "ngram", "rest"):
            raise ValueError(f"--drafter {spec}: '{suffix}' puts prompt lookup{' and retrieval' if suffix == '+rest' else ''} "
                             f"in front of a trained drafter: PATH{suffix} or draft:N{suffix} (for prompt lookup "
                             "alone use --drafter ngram)")
        if suffix == "+rest" and datastore is None:
            raise ValueError(f"--drafter {spec}: '+rest' needs a datastore (drafterkit eval --datastore SOURCE)")
        base = build_drafter(inner, target, datastore)
        hybrid = LookupHybrid(base.drafter, datastore=datastore() if suffix == "+rest" else None)
        return dataclasses.replace(base, label=f"{base.label}{suffix}", drafter=hybrid, hf_kwargs=None)
    for prefix in ("ngram+", "rest+"):
        if spec.startswith(prefix):
            raise ValueError(f"--drafter {spec}: write the drafter first and the lookup second: "
                             f"{spec[len(prefix):]}+{prefix[:-1]}")
    tail = spec.rsplit("+", 1)[-1] if "+" in spec else None
    if tail is not None and "/" not in tail and not Path(spec).exists():
        hint = (" (a threshold is not part of the spec: --draft-threshold T labels the row SPEC@T)"
                if "@" in tail else "")
        raise ValueError(f"--drafter {spec}: unknown suffix '+{tail}'; valid: PATH+ngram, PATH+rest{hint}")
    if spec == "ngram":
        d = NGramDrafter()
        return DrafterSpec("ngram", d, {"prompt_lookup_num_tokens": "{k}",
                                        "max_matching_ngram_size": d.config.max_ngram})
    if spec.startswith("draft:"):
        n = spec.split(":", 1)[1]
        layers = target.config.num_hidden_layers
        if not n.isdigit() or not 1 <= int(n) <= layers:
            raise ValueError(f"--drafter {spec}: N must be an int in [1, {layers}] (layers of the target kept)")
        d = DraftLM.from_target(target, int(n))
        return DrafterSpec(spec, d, _assistant_kwargs(d))
    return _load_checkpoint(spec, target)


def retrieval_info(specs: list[DrafterSpec]) -> dict | None:
    """What a reader needs to reproduce the ``+rest`` rows of ``specs``: ``{"datastore": {"source",
    "path", "tokens", "vocab_size", "min_ngram", "max_ngram"} (drafters.datastore.Datastore.describe),
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


def _assistant_kwargs(d) -> dict:
    # Same job as the engine: a constant K draft tokens per round, no early stop on low confidence.
    return {"assistant_model": d.lm, "num_assistant_tokens": "{k}", "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


def _load_checkpoint(spec: str, target) -> DrafterSpec:
    if spec == "rest":
        raise ValueError("--drafter rest: retrieval goes in front of a trained drafter: PATH+rest (prompt lookup "
                         "alone: --drafter ngram)")
    try:
        path, kind = resolve_checkpoint(spec, allow_transformers=True)
    except DrafterLoadError as exc:
        raise ValueError(f"--drafter {spec}: not 'none', 'ngram', 'draft:N' or a drafter checkpoint folder. "
                         f"{exc}") from None
    try:
        d = load_drafter(path, target=target)  # a transformers folder: vocabulary checked against target
    except ValueError as exc:
        raise ValueError(f"--drafter {spec}: {exc}") from None
    p = next(target.parameters())
    d.to(device=p.device, dtype=p.dtype)
    name = path.parent.name if path.name == "drafter" else path.name
    if path.name == "drafter" and path.parent.parent.name == "checkpoints":  # <run>/checkpoints/best/drafter
        name = f"{path.parent.parent.parent.name}/{name}"
    label = f"hf:{name}" if kind == TRANSFORMERS_KIND else f"{d.kind}:{name}"
    return DrafterSpec(label, d, _assistant_kwargs(d) if isinstance(d, DraftLM) else None,
                       short_name=name, folder=str(path.resolve()))


def _cut_at_eos(ids: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def stats_record(res) -> dict:
    """A ``GenerateResult``'s stats as a dict, plus ``reached_per_position`` (raw counts, so
    ``report.pooled_positions`` pools per-position acceptance exactly across calls)."""
    return dict(dataclasses.asdict(res.stats), reached_per_position=list(res.counts.reached) if res.counts else None)


def engine_method(target, spec: DrafterSpec | None, k: int, sampling: dict, eos: list[int]) -> Method:
    """A ``decode.generate`` method: plain (``spec is None``) or speculative with ``spec``'s drafter."""
    drafter = spec.drafter if spec else None
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
        k = DraftTree.parse(spec.tree).max_depth
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


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------

def warm_up(methods: list[Method], prompt: Prompt) -> float:
    """One short uncounted call of every method; returns the seconds it took."""
    t0 = time.perf_counter()
    for m in methods:
        m.call([prompt.input_ids], 0, WARMUP_TOKENS)
    return time.perf_counter() - t0


def measure(prompts: list[Prompt], methods: list[Method], max_new: int, seed: int, *, desc: str = "prompts",
            extra: dict | None = None, progress: bool = True) -> list[dict]:
    """Run every method on every prompt, interleaved prompt by prompt (method order rotated by one
    each prompt so no method always runs first). Returns one run dict per (prompt, method)."""
    from tqdm import tqdm

    runs = []
    for i, p in enumerate(tqdm(prompts, desc=desc, disable=not progress, leave=False)):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        for m in order:
            seqs, wall, stats = m.call([p.input_ids], seed + i, max_new)
            runs.append(dict(m.meta(), **(extra or {}), prompt=i, prompt_id=p.id, category=p.category, rows=1,
                             new_tokens=len(seqs[0]), wall_s=wall, stats=stats, output_ids=seqs[0]))
    return runs


def check_exactness(runs: list[dict], temperature: float, dtype: torch.dtype) -> dict:
    """Compare each spec method's output with the engine's plain output, prompt by prompt.

    Returns:
        ``{"checked", "reason", "mismatches": {method: n}, "mismatched_prompts": {method: [ids]},
        "hf_vs_engine_mismatches", "differs_from_plain", "prompts_compared"}``; counts are ``None`` when
        not checked (temperature > 0, or a dtype other than fp32 where near-ties may flip legitimately,
        or no plain engine run). ``differs_from_plain`` ({method: prompts whose output differs from the
        plain output}) is filled instead at temperature 0 in other dtypes: not an exactness failure,
        but it says how many of the timed texts diverged from plain decoding's.
    """
    plain = {r["prompt"]: r["output_ids"] for r in runs if r["role"] == "plain"}
    checked = temperature == 0 and dtype == torch.float32 and bool(plain)
    reason = ("temperature 0, fp32: speculative output must equal plain decoding token for token" if checked
              else "only checked at temperature 0 in fp32 with the engine baseline run")
    out = dict(checked=checked, reason=reason, mismatches={}, mismatched_prompts={}, hf_vs_engine_mismatches=None,
               differs_from_plain=None, prompts_compared=len(plain))
    if temperature != 0 or not plain:
        return out
    differs, prompts, hf = {}, {}, 0  # one comparison with plain per run; what it means depends on the dtype
    for r in runs:
        if r["role"] in ("spec", "hf"):
            bad = r["output_ids"] != plain[r["prompt"]]
            if r["role"] == "hf":
                hf += bad
                continue
            differs[r["method"]] = differs.get(r["method"], 0) + bad
            if bad:
                prompts.setdefault(r["method"], []).append(r["prompt_id"])
    if checked:  # fp32: a difference is an exactness failure
        out.update(mismatches=differs, mismatched_prompts=prompts,
                   hf_vs_engine_mismatches=hf if any(r["role"] == "hf" for r in runs) else None)
    else:  # informative only: near-ties at this dtype may flip legitimately
        out["differs_from_plain"] = differs
    return out


def run_sweep(target, prompts, specs, ks, temperatures, *, top_k, top_p, eos, pad, max_new, seed,
              baselines, progress=True) -> list[dict]:
    """K x temperature sweep: per temperature, every prompt runs plain, HF (if requested) and each
    drafter at each K, interleaved prompt by prompt. Returns run dicts with ``temperature`` set."""
    runs = []
    for temp in temperatures:
        sampling = dict(temperature=temp, top_k=top_k, top_p=top_p)
        methods = [engine_method(target, None, 0, sampling, eos)]
        if "hf" in baselines:
            methods.append(hf_method(target, None, 0, sampling, eos, pad))
        for s in specs:
            for k in ks:
                m = engine_method(target, s, k, sampling, eos)
                m.method = f"{s.label} K={k}"
                methods.append(m)
        runs += measure(prompts, methods, max_new, seed, desc=f"sweep T={temp:g}", extra=dict(temperature=temp),
                        progress=progress)
    return runs


def run_concurrency(target, prompts, specs, levels, *, k, sampling, eos, max_new, seed, progress=True) -> list[dict]:
    """For each concurrency c: batches of c prompts (cycled when there are fewer) decoded together,
    speculation off (plain engine) and on (each drafter), interleaved batch by batch."""
    from tqdm import tqdm

    methods = [engine_method(target, None, k, sampling, eos)] + [engine_method(target, s, k, sampling, eos)
                                                                  for s in specs]
    runs = []
    for c in levels:
        n_batches = max(1, len(prompts) // c)
        for j in tqdm(range(n_batches), desc=f"concurrency {c}", disable=not progress, leave=False):
            rows = [prompts[(j * c + t) % len(prompts)].input_ids for t in range(c)]
            for m in methods[j % len(methods):] + methods[: j % len(methods)]:
                seqs, wall, stats = m.call(rows, seed + j, max_new)
                runs.append(dict(m.meta(), concurrency=c, batch=j, category="all", rows=c,
                                 new_tokens=sum(len(s) for s in seqs), wall_s=wall, stats=stats))
    return runs


def machine_info(target) -> dict:
    """Versions, threads and device: what a reader needs to judge the figures."""
    import transformers

    p = next(target.parameters())
    info = dict(python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
                transformers=transformers.__version__, threads=torch.get_num_threads(),
                cpu_count=os.cpu_count(), device=str(p.device), dtype=str(p.dtype).removeprefix("torch."))
    if p.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(p.device)
    return info
