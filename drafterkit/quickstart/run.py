"""``drafterkit quickstart``: fetch, train and evaluate a drafter for the default target, end to end.

    drafterkit quickstart
    drafterkit quickstart --minutes 5 --kind draft_lm --output-dir runs/qs

Stages, each timed in ``report.json``: ``fetch`` (``assets.pinned.fetch_all``), ``datastore``
(``drafters.lookup.datastore``), ``train`` (``train.loop.train`` on ``recipes/<kind>.yaml`` under a time budget),
``tune`` and the model-free baselines' tune (``drafterkit.quickstart.stages``), ``eval``
(``speceval.eval_run.evaluate``) and ``exactness`` (``speceval.harness.check_exactness``); the plan and its needs
come from ``drafterkit.quickstart.plan``, the report and plots from ``drafterkit.quickstart.report``. What each
stage does and its options, for users: docs/evaluation.md, "The quickstart".
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

from drafterkit.assets.console import datasets_quiet, disable_progress_bars
from drafterkit.assets.device import dtype_name, resolve_dtype
from drafterkit.assets.pinned import AssetError, fetch_all
from drafterkit.assets.records import unwritable_folder
from drafterkit.assets.target import load_target, same_target
from drafterkit.drafters import KINDS
from drafterkit.drafters.lookup.datastore import cached_datastore
from drafterkit.quickstart.args import EXACTNESS_TOKENS
from drafterkit.quickstart.plan import Stages, feature_source, needs_lines
from drafterkit.quickstart.report import drop_report, earlier_training, print_summary, write_report
from drafterkit.quickstart.stages import (
    BENCHMARKS,
    DATASTORE,
    QUICK_TUNE,
    TARGET,
    apply_tuned,
    eval_config,
    free_tune_stage,
    own_shapes,
    eval_stage,
    eval_words,
    exactness_stage,
    measured_shapes,
    record_decoding,
    stage_names,
    tune_stage,
    tuned_summary,
)
from drafterkit.train.loop import train
from drafterkit.train.recipe import RecipeError, load_recipe

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
#: how the stage headers mark a stage the --minutes budget does not count
OUTSIDE = "outside the --minutes budget"


def default_kind() -> str:
    """``"eagle3"`` when ``recipes/eagle3.yaml`` exists, else ``"draft_lm"``."""
    return "eagle3" if (RECIPES_DIR / "eagle3.yaml").exists() else "draft_lm"


def resolve_recipe(kind: str | None, recipe: str | None) -> tuple[str, Path]:
    """``(kind, recipe path)``; ``kind`` defaults per :func:`default_kind`.

    Raises:
        ValueError: no recipe for that kind (names the path and the ``--recipe`` fix).
    """
    kind = kind or default_kind()
    path = Path(recipe) if recipe else RECIPES_DIR / f"{kind}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if p.stem in KINDS) if RECIPES_DIR.exists() \
            else []
        raise ValueError(f"no recipe {path} for drafter kind {kind!r}; pass --recipe FILE.yaml or a --kind with a "
                         f"recipe in {RECIPES_DIR} (kinds with one: {', '.join(have) or 'none'})")
    return kind, path


def resume_overrides(args, checkpoints: Path) -> list[str]:
    """The ``train.resume`` / ``train.overwrite`` overrides ``--resume`` / ``--overwrite`` ask for; without
    either, training starts at step 0 (``train.resume=never``).

    Raises:
        ValueError: ``checkpoints`` already holds checkpoints of an earlier run and neither flag was given
            (names the folder and the ways out: ``--output-dir NEW``, ``--resume``, ``--overwrite``), or
            ``--resume`` was given and it holds none."""
    held = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".tmp-")) \
        if checkpoints.is_dir() else []
    if args.resume:
        if not held:
            raise ValueError(f"--resume: {checkpoints} holds no training checkpoint to continue; run without "
                             "--resume to train from step 0 (or name the quickstart's folder with --output-dir)")
        return ["train.resume=auto"]
    if args.overwrite:
        return ["train.resume=never", "train.overwrite=true"]
    if held:
        raise ValueError(f"{checkpoints} already holds the training of an earlier quickstart ({', '.join(held)}). "
                         "Train into a new folder (--output-dir NEW), continue that training until it has trained "
                         "--minutes in all (--resume), measure it again without training (--no-train), or delete "
                         "it and train from step 0 (--overwrite)")
    return ["train.resume=never"]


def trained_checkpoint(out: Path) -> Path:
    """``OUT/train/checkpoints/last``, the checkpoint ``--no-train`` measures again.

    Raises:
        ValueError: it holds no drafter (names the folder and the fix)."""
    last = out / "train" / "checkpoints" / "last"
    if not (last / "drafter" / "config.json").is_file() or not (last / "recipe.yaml").is_file():
        raise ValueError(f"--no-train: {last} holds no trained drafter; run the quickstart without --no-train "
                         "first (or name the folder of an earlier one with --output-dir)")
    return last


def train_stage(recipe_path: Path, kind: str, minutes: float, out: Path, overrides: list[str], target, tok):
    """Train under the budget; return ``(checkpoint folder to evaluate, training summary dict)``.

    The ``minutes`` budget counts from here: data preparation (the target's regenerated responses
    when the recipe sets ``data.regenerate``) is part of it, so the stage ends on time."""
    budget_start = time.perf_counter()

    # The measured evaluation comes after training. In-loop evaluations small enough for this budget
    # (4 prompts x 32 tokens) are too noisy to pick a checkpoint: one picked step 300 of 545, whose
    # first-position top-1 was 0.29 against the last step's 0.32 (benchmarks/head_probe.py). So the loop
    # evaluates nothing and the eval stage measures the annealed last step (--set eval.every=N brings
    # the in-loop picks back, and the stage then measures best/).
    light_eval = ["eval.num_prompts=4", "eval.max_new_tokens=32", "eval.every=0", "eval.at_end=false"]
    # one step-N checkpoint (an interrupted run resumes from it) beside last/: each holds the head, its
    # optimizer state and the run state (~260 MB for the EAGLE-3 head)
    settings = [f"output_dir={out / 'train'}", f"train.max_minutes={minutes}", "train.save_total_limit=1",
                *light_eval, *overrides]
    recipe = _load_again(recipe_path, settings)
    if resolve_dtype(recipe.target.dtype) != next(target.parameters()).dtype:
        # Train against the target in the recipe's dtype (bf16 halves the target forward on CPUs with
        # bf16 units); the caller's target (evaluation dtype) is left untouched.
        target, tok = load_target(TARGET, dtype=recipe.target.dtype, device=next(target.parameters()).device,
                                  chat=True)
    if online := feature_source(recipe, target, tok):  # never a feature cache build outside the budget
        recipe = _load_again(recipe_path, [*settings, online])
    with datasets_quiet():  # its bars are a line per refresh in a log; training's own bar stays
        result = train(recipe, target=target, tokenizer=tok, budget_start=budget_start,
                       resume_hint=f"run `drafterkit quickstart --resume --output-dir {out}`")
    best, last = recipe.paths.best, recipe.paths.last
    saved = best if (best / "drafter" / "config.json").exists() or (best / "config.json").exists() else last
    # without mid-run picks the run's own last step is the one to measure (a run resumed in a used
    # --output-dir may hold an older best/ that its end-of-run score did not beat)
    ckpt = last if recipe.eval.every == 0 and last.exists() else saved
    summary = dict(recipe=str(recipe_path), kind=recipe.drafter.kind, output_dir=str(recipe.output_dir),
                   checkpoint=str(ckpt),
                   global_step=result.global_step, stopped=result.stopped, losses=result.losses,
                   final_loss=result.losses[-1] if result.losses else None, best_score=result.best_score,
                   in_loop_evals=result.evals, signal=result.signal)
    return ckpt, summary


def _load_again(recipe_path: Path, settings: list[str]):
    """``load_recipe`` of a recipe the quickstart already loaded (and checked) once: its warnings (``auto ->
    float32 here``) were printed then, so they are not printed again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_recipe(recipe_path, settings)


def run(args: argparse.Namespace) -> int:
    """Fetch, train, evaluate, check exactness, report. Returns 0, or 2 on a usage / recipe error."""
    if args.minutes <= 0 or args.exactness_prompts < 0:  # the eval flags are checked by EvalConfig.validate
        print("drafterkit quickstart: error: --minutes must be > 0 and --exactness-prompts >= 0", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        resolve_dtype(args.dtype, args.device)
    except ValueError as exc:
        print(f"drafterkit quickstart: error: --dtype: {exc}", file=sys.stderr)
        return 2
    if str(args.dtype).lower() == "auto":  # recorded and printed as what ran, so the printed commands reproduce it
        args.dtype = dtype_name("auto", args.device)
        print(f"drafterkit quickstart: --dtype auto -> {args.dtype} on this device")
    if args.no_progress:
        disable_progress_bars()
    out = Path(args.output_dir)
    timings: dict[str, float] = {}
    stages = Stages(stage_names(args), timings)
    try:
        kind, recipe_path = resolve_recipe(args.kind, args.recipe)
        if args.no_train:  # the recipe the earlier run trained with, as its last checkpoint saved it
            recipe_path = trained_checkpoint(out) / "recipe.yaml"
        recipe = load_recipe(recipe_path, [f"output_dir={out / 'train'}", *args.overrides])
        if not same_target(recipe.target.name_or_path, TARGET):  # it trains and measures the default target only
            raise ValueError(f"target.name_or_path {recipe.target.name_or_path}: the quickstart trains and measures "
                             f"a drafter for the default target ({TARGET}) only; drop that setting, or train for "
                             f"this target with `drafterkit train RECIPE` and measure it with `drafterkit eval "
                             f"--target {recipe.target.name_or_path}`")
        args.chain_only = not KINDS[recipe.drafter.kind].trees  # DFlash: its rows are measured as chains
        if args.chain_only and (tree := next((t for t in args.trees or [] if t != "chain"), None)):
            raise ValueError(f"--tree {tree}: a {recipe.drafter.kind} drafter drafts chains only; drop --tree (the "
                             "eval measures chains, in tune's chosen K) or pass --tree chain")
        if "hf-assisted" in args.baselines.split(",") and "chain" not in (args.trees or []):  # it would measure none
            raise ValueError("--baselines hf-assisted: transformers' assisted generation runs prompt lookup and draft "
                             "LMs as chains only, and the quickstart's rows draft tune's shape or a tree: add --tree "
                             "chain (and --kind draft_lm --draft-threshold 0 for the drafter's own row)")
        for bench in BENCHMARKS:  # the eval stage's settings, checked before a typo costs the training budget
            eval_config(out / "train", args, bench, recipe.eval.k)
        overrides = [] if args.no_train else [*resume_overrides(args, recipe.paths.checkpoints), *args.overrides]
        if why := unwritable_folder(out):
            raise ValueError(f"--output-dir {out}: {why}; give a folder you can write")
        out.mkdir(parents=True, exist_ok=True)  # only once every option is known good
        if args.overwrite:
            drop_report(out)
        print(f"drafterkit quickstart: plan: {', '.join(stages.names)}; needs:", *needs_lines(args, out), sep="\n",
              flush=True)
        with stages.stage("fetch", "the pinned target, ShareGPT, MT-bench and HumanEval, then load the target",
                          f"{OUTSIDE}; a no-op when cached"):
            fetch_all()
            target, tok = load_target(TARGET, dtype=args.dtype, device=args.device, chat=True)
        datastore = None
        if not args.no_hybrid:
            with stages.stage("datastore", "the ShareGPT n-gram datastore the +rest rows retrieve from",
                              f"{OUTSIDE}; built once, then read from the cache"):
                datastore = cached_datastore(DATASTORE, tok, log=print)
        features = "; target features from a complete offline cache if present, else online" \
            if recipe.data.feature_cache != "off" else ""
        if args.no_train:
            ckpt, train_summary = recipe.paths.last, earlier_training(out, recipe)
        else:
            with stages.stage("train", f"{recipe.drafter.kind} from {recipe_path}{features}",
                              f"the --minutes budget: {args.minutes:g} min, data preparation included"):
                ckpt, train_summary = train_stage(recipe_path, kind, args.minutes, out, overrides, target, tok)
    except (ValueError, RecipeError, AssetError, FileNotFoundError) as exc:
        print(f"drafterkit quickstart: error: {exc}", file=sys.stderr)
        return 2
    if train_summary["stopped"] == "interrupted":  # SIGINT / SIGTERM: last/ is saved; stop here, as asked
        sig = train_summary.get("signal") or signal.SIGINT
        print(f"drafterkit quickstart: stopped by {signal.Signals(sig).name} during training; {ckpt} is saved "
              f"(step {train_summary['global_step']}): `drafterkit quickstart --resume --output-dir {out}` continues "
              "it", file=sys.stderr)
        return 128 + int(sig)
    try:
        return _after_training(args, stages, recipe, ckpt, train_summary, target, tok, datastore, out, timings)
    except KeyboardInterrupt:
        print(f"\ndrafterkit quickstart: interrupted after training; the drafter is saved in {ckpt} (measure it with "
              f"`drafterkit eval --drafter {ckpt}`)", file=sys.stderr)
        return 130


def _after_training(args, stages, recipe, ckpt, train_summary, target, tok, datastore, out, timings) -> int:
    """The quickstart's stages after training: tune, eval, exactness, report."""
    k, tuned, tuned_rest, free = recipe.eval.k, None, None, None
    if not args.no_tune:
        behind = "" if args.no_hybrid else (", alone and behind prompt lookup + retrieval, then prompt lookup and "
                                            "suffix decoding alone if every row is to be measured in its own shape")
        with stages.stage("tune", f"drafterkit tune's search over chains, trees and thresholds{behind} ("
                          f"{QUICK_TUNE['num_prompts']} held-out ShareGPT prompts x {QUICK_TUNE['max_new_tokens']} "
                          "new tokens, batch size 1), recorded in the drafter's decoding.json", OUTSIDE):
            tuned = tune_stage(ckpt, args, target, tok)
            if not args.no_hybrid:
                tuned_rest = tune_stage(ckpt, args, target, tok, behind="+rest", datastore=datastore)
            if own_shapes(args, tuned, tuned_rest):  # else the model-free rows take the drafter's shape
                free = free_tune_stage(args, target, tok, k, datastore=datastore)
    k, tuned_note = apply_tuned(args, k, tuned, tuned_rest, free) if tuned is not None else (k, "")
    if tuned_note:
        print(f"drafterkit quickstart: {tuned_note}", flush=True)
    with stages.stage("eval", eval_words(args), f"{OUTSIDE}; not time-bounded"):
        evals = eval_stage(ckpt, args, target, tok, k, datastore)
    del target  # the fp32 check loads its own
    check = "exactness" in stages.names
    with (stages.stage("exactness", f"fp32 greedy outputs of the drafter rows vs plain decoding, "
                       f"{args.exactness_prompts} prompts per benchmark x up to "
                       f"{min(EXACTNESS_TOKENS, args.max_new_tokens)} new tokens",
                       OUTSIDE) if check else contextlib.nullcontext()):
        exactness = exactness_stage(evals, args, tok, datastore, measured_shapes(tuned, tuned_rest, ckpt))
    with stages.stage("report", f"report.json, report.md and plots in {out}", "seconds", record=False):
        reproduce = record_decoding(ckpt, evals, out, args.threads, measured_shapes(tuned, tuned_rest, ckpt))
        report_data = dict(timings=timings, train=train_summary, evals=evals, exactness=exactness,
                           reproduce=reproduce, tuned=tuned_summary(tuned, tuned_note),
                           tuned_rest=tuned_summary(tuned_rest, tuned_note),
                           tuned_free={s: tuned_summary(r, tuned_note) for s, r in (free or {}).items()})
        paths = write_report(out, report_data)
    print_summary(report_data, paths)
    return 0
