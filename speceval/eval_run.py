"""``drafterkit eval``: measure drafters on real prompts against plain decoding and transformers.

In ONE process, prompt by prompt (interleaved, method order rotated per prompt, because these
machines are noisy), run on the same chat-templated prompt:

* ``spec``: ``decode.generate`` with each drafter (``PATH`` | ``ngram`` | ``draft:N`` | ``none``),
* ``engine``: ``decode.generate(drafter=None)``, plain decoding through the same engine,
* ``hf``: ``target.generate`` (greedy or sampled with the same params, ``max_new_tokens`` and EOS),
* ``hf-assisted``: transformers' own speculative path for the same drafter where one exists
  (``assistant_model=`` for a draft LM, ``prompt_lookup_num_tokens=K`` for n-gram).

A warm-up call of every method comes first and is not counted. Every method is timed with the same
wall-clock stopwatch around its call; tokens/s = total new tokens / total seconds over the prompts;
speedups are ratios of those measurements (never derived from tau). At temperature 0 in fp32 the
speculative outputs are compared token for token with the engine's plain output (the decoder's
exactness guarantee): the mismatch count (expected 0) goes into the table and the JSON.

With the engine and ``generate`` baselines, the speedup over ``generate`` is also split into measured
factors (``speceval.factors``: the engine's own kernels, the drafter alone, prompt lookup in front of it).
Flags ``--dtype``, ``--tree``, ``--k`` and ``--draft-threshold`` not given take the values a drafter folder's
``decoding.json`` records (``speceval.recorded``, written by ``drafterkit quickstart``).

``--sweep`` adds K x temperature x category rows, a Markdown table (``speceval.report``) and PNG
plots (``speceval.plots``); ``--concurrency 1,2,4,8`` decodes that many prompts together as one batch,
speculation on vs off. The JSON record holds the config, machine info and every per-prompt run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import shlex
import sys
import time
import typing
import warnings
from pathlib import Path

import torch

from drafterkit.assets.console import disable_progress_bars, make_console
from drafterkit.assets.device import dtype_name, resolve_device
from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS
from drafterkit.assets.records import plural, unwritable_folder
from drafterkit.assets.target import (
    TargetLoadError,
    load_target,
    load_target_tokenizer,
    resolve_target_path,
    target_source_problem,
)
from drafterkit.assets.thinking import thinking_mode
from drafterkit.decode.compiled import compiled_mode
from drafterkit.decode.exact import exact_mode
from drafterkit.decode.inputs import AUTO
from drafterkit.drafters.base import DrafterLoadError
from drafterkit.drafters.export.vllm_support import kind_serve_problem
from drafterkit.drafters.lookup.datastore import cached_datastore
from drafterkit.drafters.lookup.tuned_free import FREE_SPECS
from drafterkit.drafters.target.recurrent import recurrent_target_problem
from drafterkit.drafters.target.trained_for import target_from_records, trained_for_problem
from drafterkit.drafters.tuned import NO_TUNED, TUNED_HERE
from drafterkit.speceval import plots, report
from drafterkit.speceval.compiling import compile_graphs
from drafterkit.speceval.eval_args import (
    BASELINES,
    DEFAULT_DATASTORE,
    RECORDED,
    EvalConfig,
    check_plots_dir,
    field_flag,
    flag_fields,
)
from drafterkit.speceval.factors import headline_factors
from drafterkit.speceval.harness import (
    check_exactness,
    check_quiet,
    machine_info,
    measure,
    run_concurrency,
    run_sweep,
    warm_up,
)
from drafterkit.speceval.methods import (
    build_drafters,
    build_methods,
    check_drafter_spec,
    distinct_trees,
    retrieval_info,
    suffix_info,
)
from drafterkit.speceval.prompts import select_prompts
from drafterkit.speceval.recorded import apply_recorded, checkpoint_folder, no_checkpoint, say_export_source
from drafterkit.speceval.shape_checks import check_hf_assisted, check_k, check_thresholds, check_tree_shapes

__all__ = ["DEFAULT_DATASTORE", "EvalConfig", "command_line", "evaluate", "print_record", "run", "shape_words",
           "write_outputs"]


# ---------------------------------------------------------------------------------------------
# The whole evaluation (its settings, :class:`EvalConfig`, and the flags: ``speceval.eval_args``)
# ---------------------------------------------------------------------------------------------

def _eos_and_pad(target, tok) -> tuple[list[int], int]:
    eos = getattr(target.generation_config, "eos_token_id", None) or tok.eos_token_id
    eos = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return eos, int(pad)


def evaluate(cfg: EvalConfig, target=None, tok=None, datastore=None, notes: typing.Sequence[str] = ()) -> dict:
    """Measure ``cfg.drafters`` on ``cfg.benchmark``; return the full JSON record (nothing written).

    Args:
        cfg: the evaluation; ``target`` / ``tok`` may be passed pre-loaded (else ``load_target``), and
            so may the ``+rest`` drafters' ``datastore`` (else ``cfg.datastore`` is loaded on first use).
        notes: lines about the run (``drafterkit eval``'s note on a tuned setting it takes), printed once every
            check passed (:func:`check_config`), before anything loads.

    Returns:
        ``{"config", "machine", "target", "prompts", "prompts_skipped", "thinking", "methods", "summary", "factors",
        "exactness", "runs", "timings", "retrieval"?, "sweep"?, "concurrency"?}`` (``prompts_skipped``: the
        prompts passed over and why, ``speceval.prompts.PromptSelection.skipped``; ``thinking``: the mode the
        prompts put a reasoning template in, ``on`` / ``off`` / ``no switch``, ``assets.thinking``; see
        ``speceval.report`` for the run and row fields; ``factors``: the speedup over ``generate`` split into
        measured factors, ``speceval.factors.headline_factors``; ``retrieval``, with ``+rest`` drafters only:
        ``speceval.methods.retrieval_info``; ``suffix_decoding``, with suffix rows only: their knobs,
        ``speceval.methods.suffix_info``).

    Every method is measured in the decoder's exact mode unless ``cfg.exact`` is False
    (``decode.exact_mode``: greedy speculative rows then decode plain decoding's text in bf16 / fp16 on a CPU
    too, and are checked token for token); the mode found before is restored on return. The record says which
    mode measured: ``config["exact"]`` and ``exactness["exact_mode"]``. ``cfg.compile`` compiles the target's passes
    (``decode.compiled_mode``; ``speceval.compiling.compile_graphs`` compiles them before anything is timed, saying
    so on stderr: ``timings["compile_s"]``).

    Raises:
        ValueError: bad config or drafter spec; ``drafters.DrafterLoadError``: a broken checkpoint.
    """
    with exact_mode(cfg.exact), compiled_mode(cfg.compile):
        return _evaluate(cfg, target, tok, datastore, notes)


def _evaluate(cfg: EvalConfig, target, tok, datastore, notes: typing.Sequence[str] = ()) -> dict:
    """:func:`evaluate` inside the exact mode it set."""
    check_config(cfg, target_loaded=target is not None)
    trained_for = trained_for_warnings(cfg.drafters, cfg.target)  # may refuse a drafter for another vocabulary
    for line in notes:
        print(line, flush=True)
    for line in trained_for:
        warnings.warn(line, UserWarning, stacklevel=2)
    for spec in dict.fromkeys(cfg.drafters):
        say_export_source(spec)
    timings = {}
    t0 = time.perf_counter()
    if target is None:
        target, tok = load_target(cfg.target, dtype=cfg.dtype, device=cfg.device, chat=True)
    chosen = select_prompts(cfg.benchmark, tok, cfg.num_prompts, max_prompt_tokens=cfg.max_prompt_tokens)
    prompts = chosen.prompts
    specs = build_drafters(cfg.drafters, target, cfg.draft_thresholds, cfg.trees,
                           datastore=(lambda: datastore) if datastore is not None
                           else datastore_loader(cfg.datastore or DEFAULT_DATASTORE, tok, quiet=not cfg.progress),
                           served=cfg.served_chain)
    eos, pad = _eos_and_pad(target, tok)
    sampling = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    methods = build_methods(target, specs, cfg.k, sampling, eos, pad, cfg.baselines)
    if not methods:
        raise ValueError("nothing to measure: --drafter none with no --baselines")
    timings["load_s"] = time.perf_counter() - t0
    if cfg.compile:  # every graph the rows use, compiled before anything is timed (speceval.compiling)
        if (seconds := compile_graphs(target, specs, k=cfg.k)) is None:
            cfg = dataclasses.replace(cfg, compile=False)  # the record says what ran
        else:
            timings["compile_s"] = seconds
    machine = machine_info(target, busy=check_quiet(target))
    timings["warmup_s"] = warm_up(methods, prompts[0])
    t0 = time.perf_counter()
    runs = measure(prompts, methods, cfg.max_new_tokens, cfg.seed, desc=cfg.benchmark, progress=cfg.progress)
    timings["eval_s"] = time.perf_counter() - t0
    exact = check_exactness(runs, cfg.temperature, next(target.parameters()).dtype, target.device)  # what ran
    summary = report.summarize_eval([m.meta() for m in methods], runs)
    for row in summary:
        if row["role"] == "spec":
            row["mismatches"] = exact["mismatches"].get(row["method"]) if exact["checked"] else None
    served = {s.label: p for s in specs if s.folder and  # what export says of vLLM next to this target
              (p := kind_serve_problem(getattr(getattr(s.drafter, "drafter", s.drafter), "kind", ""), cfg.target))}
    record = dict(
        tool="drafterkit eval", created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        config=dataclasses.asdict(cfg), machine=machine,
        target=dict(name=cfg.target, path=str(resolve_target_path(cfg.target)),
                    parameters=sum(p.numel() for p in target.parameters()), eos_token_id=eos),
        prompts=[dict(index=i, id=p.id, category=p.category, prompt_tokens=len(p.input_ids))
                 for i, p in enumerate(prompts)],
        prompts_skipped=chosen.skipped, thinking=thinking_mode(tok, [p.input_ids for p in prompts])[1],
        methods=[dict(m.meta(), hf_kwargs=_public_kwargs(s.hf_kwargs, cfg.k) if m.role == "hf-assisted" else None)
                 for m in methods for s in [next((x for x in specs if x.label == m.drafter), None)]],
        summary=summary, factors=headline_factors(summary, served), exactness=exact, runs=runs, timings=timings)
    if retrieval := retrieval_info(specs):
        record["retrieval"] = retrieval
    if suffix := suffix_info(specs):
        record["suffix_decoding"] = suffix
    chains = [s for s in specs if s.tree is None]  # the K sweep varies chain length; trees have none
    if cfg.sweep and chains:
        t0 = time.perf_counter()
        sweep_runs = run_sweep(target, prompts, chains, cfg.sweep_k, cfg.sweep_temperature, top_k=cfg.top_k,
                               top_p=cfg.top_p, eos=eos, pad=pad, max_new=cfg.max_new_tokens, seed=cfg.seed,
                               baselines=cfg.baselines, progress=cfg.progress)
        record["sweep"] = dict(k=cfg.sweep_k, temperature=cfg.sweep_temperature,
                               rows=report.summarize_sweep(sweep_runs), runs=sweep_runs)
        timings["sweep_s"] = time.perf_counter() - t0
    if cfg.concurrency:
        t0 = time.perf_counter()
        conc_runs = run_concurrency(target, prompts, specs, cfg.concurrency, k=cfg.k, sampling=sampling, eos=eos,
                                    max_new=cfg.max_new_tokens, seed=cfg.seed, progress=cfg.progress)
        record["concurrency"] = dict(levels=cfg.concurrency, rows=report.summarize_concurrency(conc_runs),
                                     runs=conc_runs)
        timings["concurrency_s"] = time.perf_counter() - t0
    return record


def check_config(cfg: EvalConfig, *, target_loaded: bool = False) -> None:
    """Everything about ``cfg`` that can be checked before the target loads: its flags
    (:meth:`EvalConfig.validate`), each drafter spec, the tree shapes, thresholds and swept K each drafter can
    take (from its ``config.json`` alone), and, unless ``target_loaded``, a local target folder
    (:func:`assets.target.target_source_problem`) and its tokenizer, which must have a chat template (the
    default alias is not fetched here), and a target with recurrent / linear-attention layers
    (``drafters.target.recurrent.recurrent_target_problem``): a typo costs no model
    load, and nothing is said about the run (a tuned setting's note) before it is refused.

    Raises:
        ValueError: a bad flag or drafter spec, naming it and the fix, or a target speculative decoding cannot
            verify; ``assets.target.TargetLoadError``: a broken local target folder.
    """
    cfg.validate()
    for spec in cfg.drafters:
        check_drafter_spec(spec)
    check_tree_shapes(cfg.drafters, cfg.trees)  # a shape a drafter cannot draft, from its config.json alone
    check_thresholds(cfg.drafters, cfg.draft_thresholds)
    if cfg.sweep:
        check_k(cfg.drafters, cfg.sweep_k, "--sweep-k")
    if not target_loaded and (problem := recurrent_target_problem(cfg.target)):  # whatever else the folder holds
        raise ValueError(problem)
    trees = [t for t in cfg.trees or [] if t not in ("chain", AUTO)]  # a hybrid target verifies chains only
    if not target_loaded and trees and (problem := recurrent_target_problem(cfg.target, for_trees=True)):
        raise ValueError(f"--tree {trees[0]}: {problem}")
    if not target_loaded and (problem := target_source_problem(cfg.target, check_alias=False)):
        raise TargetLoadError(problem)
    if not target_loaded and cfg.target != DEFAULT_TARGET_ALIAS and Path(resolve_target_path(cfg.target)).is_dir():
        load_target_tokenizer(cfg.target, chat=True)  # a local tokenizer that cannot load or has no chat template


def trained_for_warnings(specs: typing.Sequence[str], target: str) -> list[str]:
    """One warning line per checkpoint among the ``--drafter`` ``specs`` that was trained for another target than
    ``target`` (:func:`drafters.target.trained_for.trained_for_problem`; each folder once).

    Raises:
        drafters.DrafterLoadError: a checkpoint trained for a target of another vocabulary.
    """
    lines, seen = [], set()
    for spec in specs:
        folder = checkpoint_folder(spec)
        if folder is None or folder in seen:
            continue
        seen.add(folder)
        if line := trained_for_problem(folder, target, label=f"--drafter {spec}"):
            lines.append(line)
    return lines


def datastore_loader(source: str, tok, quiet: bool = False):
    """A zero-argument callable returning the ``drafters.lookup.datastore`` for ``source`` (built and cached
    on first use by ``cached_datastore``; loaded once however many ``+rest`` drafters ask)."""
    @functools.cache
    def load():
        try:
            return cached_datastore(source, tok, log=None if quiet else (lambda m: print(m, flush=True)))
        except (FileNotFoundError, ValueError) as exc:
            raise ValueError(f"--datastore {source}: {exc}. It takes a ShareGPT / chat JSON(L) file (assistant "
                             "turns), the pinned asset sharegpt, or a .npz saved by Datastore.save") from None
    return load


def _public_kwargs(kwargs: dict | None, k: int) -> dict | None:
    if kwargs is None:
        return None
    return {key: ("<draft model>" if key == "assistant_model" else (k if v == "{k}" else v))
            for key, v in kwargs.items()}


def output_problem(output: str | Path) -> str | None:
    """Why ``drafterkit eval`` could not write its record to ``output`` (JSON, and the Markdown beside it), or
    None: checked before anything is measured, so a bad ``--output`` never throws a finished evaluation away
    (:func:`assets.records.unwritable_folder`; the folder is made when the record is written)."""
    if str(output).endswith(("/", "\\")):  # Path() would drop the slash and write a file of the folder's name
        return f"--output {output} names a folder; give a file name such as {Path(output) / 'eval.json'}"
    output = Path(output)
    for path in (output, output.with_suffix(".md")):
        if path.is_dir():
            return f"--output {output}: {path} is a folder; give a file name such as {path / 'eval.json'}"
    if why := unwritable_folder(output.parent) or next((f"{path} is a symbolic link to nowhere" for path in (
            output, output.with_suffix(".md")) if path.is_symlink() and not path.exists()), None):
        return f"--output {output}: {why}; give a path in a writable folder"
    return None


def write_outputs(record: dict, output: str | Path, plots_dir: str | Path | None = None) -> dict:
    """Write ``output`` (JSON), ``output`` with ``.md`` (Markdown report) and, when the record has a
    sweep or a concurrency sweep, PNG plots into ``plots_dir`` (default: ``<output stem>-plots``
    next to it). Returns ``{"json", "markdown", "plots"}`` paths (also stored in the record)."""
    output = Path(output)
    png_dir = Path(plots_dir) if plots_dir else output.parent / f"{output.stem}-plots"
    pngs = []
    if record.get("sweep", {}).get("rows"):
        pngs += plots.plot_sweep(record["sweep"]["rows"], png_dir)
    if record.get("concurrency", {}).get("rows"):
        pngs.append(plots.plot_concurrency(record["concurrency"]["rows"], png_dir))
    md = output.with_suffix(".md")
    record["artifacts"] = dict(json=str(output), markdown=str(md), plots=[str(p) for p in pngs])
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(report.render_markdown(record))
    report.write_json(output, record)
    return record["artifacts"]


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The :class:`EvalConfig` of parsed ``drafterkit eval`` flags (``speceval.eval_args.add_arguments``): a flag never
    given whose parsed value is ``None`` (repeatable flags, those a ``decoding.json`` may set) takes the
    field's default (``drafterkit eval`` then applies a drafter's ``decoding.json``: :func:`run`),
    ``--no-<name>`` sets ``<name>`` to False, and a tree given twice is measured once
    (:func:`speceval.methods.distinct_trees`)."""
    hints = typing.get_type_hints(EvalConfig)
    values = {}
    for f in dataclasses.fields(EvalConfig):
        _, kwargs = field_flag(f, hints[f.name])
        value = getattr(args, kwargs["dest"])
        if kwargs["dest"] != f.name:  # --no-<name>
            value = not value
        if value is not None:
            values[f.name] = value
    cfg = EvalConfig(**values)
    cfg.trees = distinct_trees(cfg.trees)
    return cfg


def shape_words(cfg: dict) -> str:
    """The draft shapes of an eval config, for its table's title: ``K=5`` for chains only, the trees where
    there are trees (a tree's depth is its K, so ``K=`` over a tree row would misname it), ``tuned shapes`` for
    ``--tree auto`` (with the K of the rows that are no checkpoint)."""
    trees = list(cfg.get("trees") or ["chain"])
    if trees == [AUTO]:
        return f"each checkpoint in its tuned shape (others: chains of K={cfg['k']})"
    shaped = [t for t in trees if t != "chain"]
    tree_words = f"tree{'s' if len(shaped) > 1 else ''} {' / '.join(shaped)}"
    if not shaped:
        return f"K={cfg['k']}"
    return tree_words if "chain" not in trees else f"chains of K={cfg['k']} and {tree_words}"


def print_record(record: dict, console=None, exactness_note: str | None = None) -> None:
    """Print the eval table and, when present, the sweep (category ``all``) and concurrency tables.
    ``exactness_note``: what to say of exactness instead of the record's own verdict (the quickstart checks
    it in a later fp32 stage)."""
    console = console or make_console()
    cfg = record["config"]
    title = (f"{cfg['benchmark']}: {plural(len(record['prompts']), 'prompt')}, {cfg['max_new_tokens']} new tokens, "
             f"T={cfg['temperature']:g}, {shape_words(cfg)}, {record['machine']['dtype']} on "
             f"{record['machine']['device']}{report.mode_words(cfg)}")
    report.print_eval(record["summary"], title, console)
    if record.get("factors"):
        report.print_factors(record["factors"], console)
    ex = record["exactness"]
    console.print(f"exactness: {exactness_note or report.exactness_text(ex)}")
    if note := report.small_sample_note(record):
        console.print(f"note: {note}")
    if "sweep" in record:
        rows = [r for r in record["sweep"]["rows"] if r["category"] == "all"]
        console.print(report.rich_table("sweep (all categories)", rows, report.SWEEP_COLUMNS))
    if "concurrency" in record:
        console.print(report.rich_table("concurrency", record["concurrency"]["rows"], report.CONCURRENCY_COLUMNS))


def recorded_message(info: dict, tree_auto: bool = False) -> str:
    """What ``drafterkit eval`` prints about a drafter's ``decoding.json``
    (``speceval.recorded.apply_recorded``), as one sentence: the settings found (its top-level fields, or its
    ``drafterkit tune`` setting where that is used), whether they are used, and why not: the command line gave
    every one of them (naming those flags), the drafters' files disagree, or the file holds no setting but a
    tuned one this eval cannot use (slower than plain decoding, another machine ...: ``info["tuned"]``).
    ``tree_auto``: the eval runs ``--tree auto``, so each checkpoint row runs the tuned setting itself, whatever
    the command line gives for ``--k`` and ``--draft-threshold``."""
    why = info.get("tuned") or ""
    tuned_used = why.startswith(TUNED_HERE)
    if tree_auto and tuned_used and not info["note"]:
        head = f"drafterkit eval: {info['file']}" + (f" ({info['source']})" if info["source"] else "")
        return (f"{head}: its drafterkit tune setting used: --tree auto measures each checkpoint row in the chain "
                "/ tree, K and draft threshold tune recorded for it on this machine")
    tuned_unused = f"; {why}" if why and not tuned_used and not why.startswith(NO_TUNED) else ""
    said = "; ".join(x for x in (info["source"], why if tuned_used else "") if x)
    head = f"drafterkit eval: {info['file']}" + (f" ({said})" if said else "")
    found = "its drafterkit tune setting" if tuned_used else "its decoding settings"
    if info["note"]:
        return f"{head}: {found} not used, since {info['note']}{tuned_unused}"
    given = ", ".join(RECORDED[k] for k in info["overridden"])
    if not info["applied"] and not given:  # nothing at the top level, and the tuned setting (if any) unusable
        what = f"only a drafterkit tune setting, and {why}" if tuned_unused else "no decoding setting"
        return f"{head}: nothing taken from it, eval's defaults apply: it records {what}"
    if not info["applied"]:
        return f"{head}: {found} not used, since the command line gives every one it records ({given}){tuned_unused}"
    kept = f"; the command line's own {given} kept (flags given explicitly win)" if given else ""
    return f"{head}: decoding settings taken from it: {info['flags']}{kept}{tuned_unused}"


def command_line(config: dict, *, threads: int | None = None, output: str | Path | None = None,
                 always: tuple[str, ...] = ("drafters", "benchmark", "num_prompts", "max_new_tokens", "k",
                                            "draft_thresholds", "trees", "dtype", "baselines")) -> str:
    """The ``drafterkit eval`` command that measures ``config`` (an :class:`EvalConfig` as a dict, e.g. a
    record's ``config``): every field in ``always`` and every other one that differs from its default, as
    flags (``progress`` left out), then ``--threads`` and ``--output`` when given; quoted for a shell."""
    defaults = dataclasses.asdict(EvalConfig())
    argv = ["drafterkit", "eval"]
    for f, hint in flag_fields():
        if f.name not in config or f.name == "progress" or \
                (f.name not in always and config[f.name] == defaults[f.name]):
            continue
        flag, kwargs = field_flag(f, hint)
        value = config[f.name]
        if hint is bool:
            argv += [flag] if value != defaults[f.name] else []
        elif kwargs.get("action") == "append":
            argv += [a for v in value for a in (flag, str(v))]
        elif value is not None:
            argv += [flag, ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
                     if isinstance(value, list) else str(value)]
    argv += ["--threads", str(threads)] if threads else []
    argv += ["--output", str(output)] if output is not None else []
    return shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    """``drafterkit eval``: 0 on success, 2 on a usage error (message on stderr). Flags of
    ``speceval.eval_args.RECORDED`` not given take the values the drafters' ``decoding.json`` records; ``--target``
    not given, the target the drafters' training recipe records (``drafters.target.trained_for.target_from_records``;
    refused when they record different ones), else the default one."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        disable_progress_bars()
    try:
        resolve_device(args.device)  # an unknown or absent device, before anything loads
        if problem := output_problem(args.output):
            raise ValueError(problem)
        cfg = config_from_args(args)
        for spec in cfg.drafters:  # a broken drafter is the first thing said, before any note about the run
            check_drafter_spec(spec)
        if args.target is None and (found := target_from_records({f"--drafter {d}": checkpoint_folder(d)
                                                                   for d in cfg.drafters})):
            cfg.target = found[0]  # the target the checkpoint was trained for, not the default one
            print(f"drafterkit eval: --target {cfg.target} (the target {found[1]} was trained for, its recipe.yaml)",
                  flush=True)
        check_plots_dir(args.plots_dir, cfg)
        given = {name for name in RECORDED if getattr(args, name) is not None}
        recorded = apply_recorded(cfg, given=given)
        if str(cfg.dtype).lower() == "auto":  # recorded and printed as what ran, so the printed commands reproduce it
            cfg.dtype = dtype_name("auto", cfg.device)
            print(f"drafterkit eval: --dtype auto -> {cfg.dtype} on this device", flush=True)
        notes = [recorded_message(recorded, tree_auto=cfg.trees == [AUTO])] if recorded else []
        if untuned := [d for d in cfg.drafters if cfg.trees == [AUTO] and d not in ("none", *FREE_SPECS)
                       and no_checkpoint(d)]:  # draft:N: nothing to tune (ngram, suffix: their own records)
            notes.append(f"drafterkit eval: --tree auto: {', '.join(untuned)} {'is' if len(untuned) == 1 else 'are'} "
                         f"no checkpoint, so nothing was tuned: measured as a chain of K={cfg.k} (add --tree chain or "
                         "--tree TREE for other shapes)")
        shaped = [f for f, used in (("--tree", cfg.trees != ["chain"]),
                                    ("--draft-threshold", any(t != 0 for t in cfg.draft_thresholds))) if used]
        if shaped and all(d == "none" for d in cfg.drafters):
            raise ValueError(f"{' and '.join(shaped)} {'shape' if len(shaped) > 1 else 'shapes'} a drafter's drafts, "
                             "but --drafter none measures only "
                             "the baselines; add a --drafter (e.g. ngram or a checkpoint) or drop "
                             f"{' and '.join(shaped)}")
        if "k" in given:  # eval's default K is cut to a drafter's bound in its rows; one given is refused above it
            check_k(cfg.drafters, [cfg.k])
        if "hf-assisted" in cfg.baselines and cfg.baselines != list(BASELINES):  # named, not the default "all"
            check_hf_assisted(cfg.drafters, cfg.trees, cfg.draft_thresholds)
        record = evaluate(cfg, notes=notes)
    except (ValueError, DrafterLoadError, OSError) as exc:
        print(f"drafterkit eval: error: {exc}", file=sys.stderr)
        return 2
    if recorded:
        record["recorded_decoding"] = recorded
    paths = write_outputs(record, args.output, args.plots_dir)
    print_record(record)
    print(f"wrote {paths['json']} and {paths['markdown']}" + (f" and {len(paths['plots'])} plots" if paths['plots']
                                                               else ""))
    return 0
