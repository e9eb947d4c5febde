"""``drafterkit quickstart``: fetch, train and evaluate a drafter for the default target, end to end.

    drafterkit quickstart        # 14.5 min training; ~22 min in all on 2 cores with bf16 units, ~34 in fp32
    drafterkit quickstart --minutes 5 --kind draft_lm --output-dir runs/qs

Before it starts, the quickstart states its plan and what it needs (time, memory, disk); each stage then
prints a one-line header (what it does, its share of the time) and the seconds it took
(``train.quickstart_plan``). Stages (each timed, in seconds, in ``report.json``):

1. ``fetch``: the pinned assets (``assets.pinned.fetch_all``: target, ShareGPT, MT-bench, HumanEval),
   a no-op when cached; then the target is loaded once and shared by the next stages.
2. ``datastore``: the ShareGPT datastore the ``+rest`` row retrieves from (``drafters.datastore``:
   every assistant turn outside the held-out split, tokenized; ~35 s once, then loaded from the
   cache in ~5 s); skipped with ``--no-hybrid``.
3. ``train``: the kind's recipe (``recipes/<kind>.yaml``, or ``--recipe``) with
   ``train.max_minutes=<minutes>`` and ``output_dir=<output-dir>/train`` (plus any ``--set``). The
   budget counts data preparation; no feature cache is built: a recipe reading the offline cache reads a
   complete one when present, else computes the target's features online
   (``train.quickstart_plan.feature_source``; docs/training.md has the measurement behind it). An
   output folder already holding training checkpoints is refused unless ``--resume`` (continue that
   training), ``--overwrite`` (delete it) or ``--no-train`` (skip this stage and measure its last checkpoint
   again) says what to do with them.
4. ``tune``: ``drafterkit tune`` on the trained drafter with a small search (:data:`QUICK_TUNE`: chains,
   the fixed tree, EAGLE-2 dynamic trees, thresholds; held-out ShareGPT prompts, never the eval's),
   recorded in the drafter's ``decoding.json``; the fixed tree is tune's incumbent, replaced only by a
   candidate faster beyond the noise (``speceval.tune_search.halving``). The eval stage measures the winner
   when it beat plain decoding and neither ``--tree`` nor ``--draft-threshold`` was given, else the fixed tree;
   ``--no-tune`` skips the stage.
5. ``eval``: the last checkpoint (the end of the time-bound cosine schedule; the quickstart runs no
   mid-run evaluations, which at this budget are too noisy to pick a checkpoint) on MT-bench first
   turns and HumanEval prompts through ``speceval.bench.evaluate``: speculative decoding with the
   drafter alone, prompt lookup alone (``ngram``) and the drafter behind prompt lookup plus retrieval
   from a ShareGPT datastore (``PATH+rest``, ``drafters.hybrid.LookupHybrid``; ``--no-hybrid`` skips
   it), with the tuned shape or the draft tree ``3,2,1,1,1`` (``--tree``, repeatable; ``chain`` = a chain
   of K), vs plain
   decoding through the same engine vs transformers ``generate`` (and its own assisted generation
   where the drafter is a draft LM), interleaved prompt by prompt. Each benchmark's report splits
   the speedup over ``generate`` into measured factors (``speceval.factors``).
6. ``exactness``: unless the eval ran in fp32 (then its rows are checked), a short fp32 greedy run of
   the drafter's rows on ``--exactness-prompts`` prompts per benchmark, whose outputs must equal plain
   decoding's token for token (``speceval.harness.check_exactness``).

The settings the drafter was measured with go into its folder as ``decoding.json``
(``speceval.recorded``), which ``drafterkit eval --drafter PATH`` reads; the ``drafterkit eval`` commands
that reproduce the eval rows are printed at the end and kept in the report. The report folder gets
``report.json`` (stage timings, training summary, the eval records, the exactness check, those
commands), ``report.md`` and PNGs (``train.quickstart_report``).
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
from drafterkit.assets.device import resolve_dtype
from drafterkit.assets.pinned import AssetError, fetch_all
from drafterkit.assets.records import plural, unwritable_folder
from drafterkit.assets.target import load_target
from drafterkit.decode.inputs import AUTO
from drafterkit.drafters import KINDS, resolve_checkpoint
from drafterkit.drafters.base import weights_sha256
from drafterkit.drafters.datastore import cached_datastore
from drafterkit.drafters.tuned import beats_plain
from drafterkit.speceval.bench import EvalConfig, command_line, evaluate, print_record
from drafterkit.speceval.recorded import write_decoding
from drafterkit.speceval.tune import tune
from drafterkit.speceval.tune_search import Candidate
from drafterkit.train.loop import train
from drafterkit.train.quickstart_args import (
    DEFAULT_THRESHOLD,
    DEFAULT_TREES,
    EVAL_DEFAULTS,
    EXACTNESS_TOKENS,
)
from drafterkit.train.quickstart_plan import Stages, feature_source, needs_lines
from drafterkit.train.quickstart_report import (drop_report, earlier_training, exactness_summary, merge_checks,
                                                print_summary,
                                    write_report)
from drafterkit.train.recipe import RecipeError, load_recipe

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
BENCHMARKS = ("mt-bench", "humaneval")
#: The ``drafterkit tune`` search the quickstart runs after training (``speceval.tune.tune`` arguments): chains
#: of 3 and 5, the fixed tree, two EAGLE-2 dynamic trees, three thresholds (15 candidates), successive halving
#: at batch size 1 on 4 held-out ShareGPT prompts x 32 new tokens (never the MT-bench / HumanEval prompts the
#: eval stage measures)
QUICK_TUNE = dict(ks=[3, 5], dynamic=["dynamic:12:4:3", "dynamic:24:5:4"], thresholds=[0.05, 0.1, 0.2],
                  benchmark="sharegpt", num_prompts=4, max_new_tokens=32, concurrency=1, eta=3, first=1)
#: the shape the drafter behind prompt lookup + retrieval keeps unless a challenger is faster beyond the noise:
#: behind lookup a chain of 5 beat the fixed tree on unseen MT-bench (1.58x vs 1.47x and 1.60x vs 1.51x plain
#: decoding, two runs; BENCHMARKS.md, "Tuning the head behind lookup + retrieval as its own proposer")
REST_INCUMBENT = "chain:5@0.1"
#: the target the quickstart trains for and the corpus its ``+rest`` rows retrieve from
TARGET, DATASTORE = EVAL_DEFAULTS.target, "sharegpt"
#: what the report calls the fp32 exactness check run apart from the eval (:data:`EXACTNESS_TOKENS` new tokens)
SEPARATE_CHECK = "a separate fp32 run"
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
        target, tok = load_target(TARGET, dtype=recipe.target.dtype, device=next(target.parameters()).device)
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


def tune_stage(ckpt: Path, args, target, tok, *, target_name: str = TARGET, behind: str = "", datastore=None,
               **search) -> dict:
    """``drafterkit tune`` on the trained drafter (``behind="+rest"``: on the drafter behind prompt lookup +
    retrieval from ``datastore``, a proposer with its own best shape, from the incumbent :data:`REST_INCUMBENT`)
    with :data:`QUICK_TUNE`'s search (``search`` overrides entries of it), written into its folder's
    ``decoding.json`` (``speceval.tune.tune``); returns tune's record (``winners``, ``table``, ``search``...)."""
    own = dict(incumbent=REST_INCUMBENT, datastore=datastore) if behind == "+rest" else {}
    return tune(f"{ckpt}{behind}", target_name=target_name, dtype=args.dtype, device=args.device,
                trees=list(DEFAULT_TREES), target=target, tok=tok, progress=not args.no_progress, write=True,
                **{**QUICK_TUNE, **own, **search})


def apply_tuned(args, k: int, tuned: dict | None, tuned_rest: dict | None = None) -> tuple[int, str]:
    """Make the eval stage measure tune's batch-size-1 winners: set ``args.trees`` / ``args.draft_thresholds``
    and return ``(K, what was done)``. With a usable winner for the drafter behind lookup + retrieval too
    (``tuned_rest``), every row is measured in its own tuned shape (``--tree auto``; prompt lookup alone,
    which has none, as a chain of K); else every row in the drafter's winner. Left as they are (and said
    why) when ``--tree`` or ``--draft-threshold`` was given (explicit flags win), when there is no tuned
    record, or when the drafter's winner was not faster than plain decoding (``drafters.tuned.beats_plain``:
    the fixed tree is measured instead)."""
    w = ((tuned or {}).get("winners") or {}).get("1")
    if w is None:
        return k, f"no tuned setting: the eval measures {' and '.join(args.trees or DEFAULT_TREES)}"
    found = _found(w)
    if args.trees or args.draft_thresholds is not None:
        return k, f"tune chose {found}; the eval measures the --tree / --draft-threshold given instead"
    if not beats_plain(w):
        fixed = " and ".join(DEFAULT_TREES)
        return k, (f"tune's choice, {found}, was not faster than plain decoding: the eval measures the fixed tree "
                   + (f"{fixed} all the same" if w["tree"] in DEFAULT_TREES else f"{fixed} instead"))
    rest = ((tuned_rest or {}).get("winners") or {}).get("1")
    if rest is not None and beats_plain(rest):
        args.trees = [AUTO]
        return k, (f"tune chose {found} for the drafter alone and {_found(rest)} for it behind prompt lookup + "
                   f"retrieval: the eval measures each in its own tuned shape, prompt lookup alone as a chain of {k}")
    args.trees, args.draft_thresholds = [w["tree"]], str(w["draft_threshold"])
    why = "" if rest is None else f" (behind prompt lookup + retrieval tune's choice, {_found(rest)}, was not faster " \
                                  "than plain decoding)"
    return int(w["k"]), f"tune chose {found}: the eval measures it{why}"


def _found(w: dict) -> str:
    return (f"{Candidate(w['tree'], int(w['k']), float(w['draft_threshold'])).label} ({w['speedup']:.2f}x plain "
            f"decoding on the tuning prompts)")


def measured_shapes(tuned: dict | None, tuned_rest: dict | None, ckpt: Path) -> dict[str, dict]:
    """``{drafter spec: tune's batch-size-1 winner}`` of the rows an ``--tree auto`` eval measured in their own
    tuned shape (the drafter, and the drafter behind lookup + retrieval), for the fp32 exactness check."""
    out = {}
    for spec, rec in ((str(ckpt), tuned), (f"{ckpt}+rest", tuned_rest)):
        w = ((rec or {}).get("winners") or {}).get("1")
        if w is not None:
            out[spec] = w
    return out


def eval_config(ckpt: Path, args, bench: str, k: int, *, target_name: str = TARGET,
                datastore_source: str = DATASTORE):
    """The ``speceval.bench.EvalConfig`` of one benchmark, validated: the drafter alone, prompt lookup alone
    (``ngram``) and, unless ``--no-hybrid``, the drafter behind prompt lookup + retrieval from
    ``datastore_source``, on the target ``target_name``. Raises ``ValueError`` naming the bad flag."""
    try:
        thresholds = [float(x) for x in str(args.draft_thresholds or DEFAULT_THRESHOLD).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--draft-threshold takes comma-separated numbers, got {args.draft_thresholds!r}") from None
    drafters = [str(ckpt), "ngram"] + ([] if args.no_hybrid else [f"{ckpt}+rest"])
    cfg = EvalConfig(target=target_name, drafters=drafters, benchmark=bench,
                     num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, k=k, dtype=args.dtype,
                     draft_thresholds=thresholds, trees=args.trees or list(DEFAULT_TREES),
                     device=args.device, progress=not args.no_progress,
                     baselines=[b for b in args.baselines.split(",") if b],
                     datastore=None if args.no_hybrid else datastore_source)
    cfg.validate()
    return cfg


def eval_stage(ckpt: Path, args, target, tok, k: int, datastore=None, **names) -> dict:
    """``speceval.bench.evaluate`` of the checkpoint on each benchmark with the loaded ``target`` and
    ``datastore`` (``names``: :func:`eval_config`'s ``target_name`` and ``datastore_source``, the names
    the records and the printed commands carry); returns ``{benchmark: record}``."""
    records = {}
    for bench in BENCHMARKS:
        records[bench] = evaluate(eval_config(ckpt, args, bench, k, **names), target=target, tok=tok,
                                  datastore=datastore)
        print_record(records[bench], exactness_note=exactness_later(args))
    return records


def exactness_later(args) -> str | None:
    """What an eval block says of exactness when the exactness stage checks it after the measurements (an eval
    in another dtype than fp32, where the rows themselves are not compared), else None (the row's own verdict)."""
    if "exactness" not in stage_names(args):
        return None
    return (f"checked after these measurements, in the exactness stage (fp32, greedy, "
            f"{plural(args.exactness_prompts, 'prompt')} per benchmark vs plain decoding)")


def exactness_stage(records: dict, args, tok, datastore=None, shapes: dict | None = None) -> dict:
    """The fp32 greedy check: the drafter's rows of each eval record (not ``ngram``'s) on its first
    ``--exactness-prompts`` prompts, :data:`EXACTNESS_TOKENS` new tokens at most, against plain decoding
    through the same engine, with a target loaded in fp32 (``speceval.harness.check_exactness`` via
    ``speceval.bench.evaluate``); rows an ``--tree auto`` eval measured in their own tuned shape are checked
    in it (``shapes``: :func:`measured_shapes`). With ``--dtype fp32`` the eval rows themselves were checked and are
    summarized instead. Returns ``train.quickstart_report.exactness_summary``."""
    if resolve_dtype(args.dtype) == torch.float32:
        return exactness_summary(records, "the measured rows")
    if args.exactness_prompts <= 0:
        return exactness_summary({}, "skipped: --exactness-prompts 0")
    first = next(iter(records.values()))["config"]
    target, _ = load_target(first["target"], dtype="fp32", device=args.device)
    checks = {}
    for bench, rec in records.items():
        base = {**rec["config"], "dtype": "fp32", "num_prompts": args.exactness_prompts,
                "max_new_tokens": min(EXACTNESS_TOKENS, args.max_new_tokens), "baselines": ["engine"]}
        drafters = [d for d in rec["config"]["drafters"] if d != "ngram"]
        if rec["config"]["trees"] != [AUTO]:
            configs = [EvalConfig(**{**base, "drafters": drafters})]
        else:  # each row in the shape it was measured in: tune's setting, spelled out (it was tuned in another dtype)
            configs = [EvalConfig(**{**base, "drafters": [d], "trees": [shapes[d]["tree"]], "k": int(shapes[d]["k"]),
                                     "draft_thresholds": [float(shapes[d]["draft_threshold"])],
                                     "datastore": base["datastore"] if d.endswith("+rest") else None})
                       for d in drafters]
        checks[bench] = merge_checks([evaluate(cfg, target=target, tok=tok, datastore=datastore) for cfg in configs])
    return exactness_summary(checks, SEPARATE_CHECK)


def record_decoding(ckpt: Path, records: dict, out: Path, threads: int | None = None,
                    shapes: dict | None = None) -> dict:
    """Write the eval's decoding settings into the drafter's folder (``decoding.json``, which
    ``drafterkit eval --drafter`` reads; after an ``--tree auto`` eval, the drafter's own tuned shape spelled
    out, ``shapes``: :func:`measured_shapes`, so that it holds on any machine) with the ``drafterkit eval``
    commands that reproduce each benchmark's rows (output ``<out>/eval-<benchmark>.json``); returns
    ``{"decoding_json", "commands"}``."""
    commands = [command_line(rec["config"], threads=threads, output=out / f"eval-{bench}.json")
                for bench, rec in records.items()]
    first = dict(next(iter(records.values())))
    own = (shapes or {}).get(str(ckpt))
    if first["config"]["trees"] == [AUTO] and own is not None:
        first["config"] = {**first["config"], "trees": [own["tree"]], "k": int(own["k"]),
                           "draft_thresholds": [float(own["draft_threshold"])]}
    folder = resolve_checkpoint(ckpt)[0]
    # the report's absolute path and the hash of the weights measured: `drafterkit export` finds the measured
    # numbers for its model card through them, and ignores them once the folder holds other weights
    path = write_decoding(folder, first["config"], written_by="drafterkit quickstart", machine=first["machine"],
                          report=str((out / "report.json").resolve()), weights_sha256=weights_sha256(folder),
                          commands=commands)
    return dict(decoding_json=str(path), commands=commands)


def _tuned_summary(tuned: dict | None, note: str) -> dict | None:
    """What the report keeps of the tune stage: the winner, the search, the note on what the eval measured."""
    if tuned is None:
        return None
    return dict(winner=tuned["winners"].get("1"), search=tuned["search"], prompts=tuned["prompts"], note=note,
                file=tuned.get("file"), table=tuned["table"])


def stage_names(args) -> list[str]:
    """The stages this run goes through, in order (``datastore`` unless ``--no-hybrid``; ``exactness``
    unless the eval runs in fp32, whose rows are checked themselves, or ``--exactness-prompts 0``)."""
    separate = resolve_dtype(args.dtype) != torch.float32 and args.exactness_prompts > 0
    return ["fetch", *([] if args.no_hybrid else ["datastore"]), *([] if args.no_train else ["train"]),
            *([] if args.no_tune else ["tune"]), "eval", *(["exactness"] if separate else []), "report"]


def eval_words(args, k: int = 5) -> str:
    """What the eval stage measures, in words, for its header (``k``: the chain prompt lookup alone drafts when
    every other row is measured in its own tuned shape)."""
    rows = ["the drafter alone", "prompt lookup alone"] + ([] if args.no_hybrid else ["the drafter + lookup + "
                                                                                     "retrieval"])
    if args.trees == [AUTO]:
        shapes = f"each trained row in its own tuned shape, prompt lookup alone as a chain of {k}"
    else:
        shapes = f"draft shape {', '.join(args.trees or DEFAULT_TREES)}, threshold " \
                 f"{args.draft_thresholds or DEFAULT_THRESHOLD}"
    return (f"{', '.join(rows)} ({shapes}) vs {args.baselines.replace(',', ', ')} on {' and '.join(BENCHMARKS)}, "
            f"{plural(args.num_prompts, 'prompt')} x up to {args.max_new_tokens} new tokens each, {args.dtype}")


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
        args.dtype = "bf16" if resolve_dtype("auto", args.device) == torch.bfloat16 else "fp32"
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
            target, tok = load_target(TARGET, dtype=args.dtype, device=args.device)
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
    k, tuned, tuned_rest = recipe.eval.k, None, None
    if not args.no_tune:
        behind = "" if args.no_hybrid else ", alone and behind prompt lookup + retrieval"
        with stages.stage("tune", f"drafterkit tune's search over chains, trees and thresholds{behind} ("
                          f"{QUICK_TUNE['num_prompts']} held-out ShareGPT prompts x {QUICK_TUNE['max_new_tokens']} "
                          "new tokens, batch size 1), recorded in the drafter's decoding.json", OUTSIDE):
            tuned = tune_stage(ckpt, args, target, tok)
            if not args.no_hybrid:
                tuned_rest = tune_stage(ckpt, args, target, tok, behind="+rest", datastore=datastore)
    k, tuned_note = apply_tuned(args, k, tuned, tuned_rest) if tuned is not None else (k, "")
    if tuned_note:
        print(f"drafterkit quickstart: {tuned_note}", flush=True)
    with stages.stage("eval", eval_words(args, k), f"{OUTSIDE}; not time-bounded"):
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
                           reproduce=reproduce, tuned=_tuned_summary(tuned, tuned_note),
                           tuned_rest=_tuned_summary(tuned_rest, tuned_note))
        paths = write_report(out, report_data)
    print_summary(report_data, paths)
    return 0
