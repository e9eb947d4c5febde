"""``drafterkit quickstart``: fetch, train and evaluate a drafter for the default target, end to end.

    drafterkit quickstart                                  # <= 20 min in all (14.5 min training), EAGLE-3 if its recipe exists
    drafterkit quickstart --minutes 5 --kind draft_lm --output-dir runs/qs

Stages (each timed, in seconds, in ``report.json``):

1. ``fetch``: the pinned assets (``assets.pinned.fetch_all``: target, ShareGPT, MT-bench, HumanEval),
   a no-op when cached; then the target is loaded once and shared by the next stages.
2. ``datastore``: the ShareGPT datastore the ``+rest`` row retrieves from (``drafters.datastore``:
   every assistant turn outside the held-out split, tokenized; ~35 s once, then loaded from the
   cache in ~5 s); skipped with ``--no-hybrid``.
3. ``train``: the kind's recipe (``recipes/<kind>.yaml``, or ``--recipe``) with
   ``train.max_minutes=<minutes>`` and ``output_dir=<output-dir>/train`` (plus any ``--set``).
4. ``eval``: the last checkpoint (the end of the time-bound cosine schedule; the quickstart runs no
   mid-run evaluations, which at this budget are too noisy to pick a checkpoint) on MT-bench first
   turns and HumanEval prompts through ``speceval.bench.evaluate``: speculative decoding with the
   drafter alone and behind prompt lookup plus retrieval from a ShareGPT datastore (``PATH+rest``,
   ``drafters.hybrid.LookupHybrid``; ``--no-hybrid`` skips it), as the draft
   tree ``3,2,1,1,1`` (``--tree``, repeatable; ``chain`` = a chain of K), vs plain decoding through the
   same engine vs transformers ``generate`` (and its own assisted generation where the drafter is a
   draft LM), interleaved prompt by prompt.

The report folder gets ``report.json`` (stage timings, training summary, both eval records),
``report.md`` and PNGs (tokens/s per method, per-position acceptance, training loss).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from assets.device import resolve_dtype
from assets.pinned import AssetError, fetch_all
from assets.target import load_target
from drafters.datastore import cached_datastore
from speceval import plots, report
from speceval.bench import EvalConfig, evaluate, print_record
from train.loop import train
from train.recipe import RecipeError, load_recipe

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
BENCHMARKS = ("mt-bench", "humaneval")
#: Draft shapes the quickstart measures: a static tree (the 3 best first tokens, 2 after each, then one per
#: depth to depth 5, so prompt lookup's chains keep K = 5 tokens behind it: 3 + 6 + 6 + 6 + 6 nodes before
#: the threshold prunes them). It beat the chain of 5 in every side-by-side run (BENCHMARKS.md); add
#: ``--tree chain`` to measure the chain too.
DEFAULT_TREES = ("3,2,1,1,1",)
#: ``drafterkit eval``'s defaults, which the quickstart's eval flags share unless it sets its own (draft threshold,
#: tree, dtype)
EVAL_DEFAULTS = EvalConfig()


def default_kind() -> str:
    """``"eagle3"`` when ``recipes/eagle3.yaml`` exists, else ``"draft_lm"``."""
    return "eagle3" if (RECIPES_DIR / "eagle3.yaml").exists() else "draft_lm"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=14.5,
                   help="training budget in minutes (train.max_minutes); fetch + eval add ~4 min on a 2-core CPU")
    p.add_argument("--output-dir", default="drafterkit-quickstart", help="report folder (training under train/)")
    p.add_argument("--kind", default=None, help="drafter kind: eagle3 | eagle | medusa | draft_lm "
                                                "(default: eagle3 if recipes/eagle3.yaml exists, else draft_lm)")
    p.add_argument("--recipe", default=None, help="recipe YAML (default: recipes/<kind>.yaml)")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="extra recipe override, repeatable (e.g. --set data.num_examples=200)")
    p.add_argument("--num-prompts", type=int, default=EVAL_DEFAULTS.num_prompts, help="eval prompts per benchmark")
    p.add_argument("--max-new-tokens", type=int, default=EVAL_DEFAULTS.max_new_tokens,
                   help=f"new tokens per answer (default {EVAL_DEFAULTS.max_new_tokens}; speedups grow with the answer "
                        "length on this target, see BENCHMARKS.md)")
    p.add_argument("--baselines", default=",".join(EVAL_DEFAULTS.baselines),
                   help="comma-separated, as in drafterkit eval")
    p.add_argument("--draft-threshold", default="0.1", dest="draft_thresholds",
                   help="comma-separated confidence thresholds measured side by side (0: a chain of K / the full "
                        "tree; >0: draft tokens whose path probability under the drafter falls below it are not "
                        "proposed, EAGLE-2 style; default 0.1)")
    p.add_argument("--tree", action="append", dest="trees", metavar="TREE",
                   help=f"draft shapes measured side by side, repeatable: chain (K tokens) or a static tree such as "
                        f"3,2,1 (branching factors per depth; see drafterkit eval --tree). Default: "
                        f"{' and '.join(DEFAULT_TREES)}")
    p.add_argument("--no-hybrid", action="store_true",
                   help="do not also measure the drafter behind prompt lookup and retrieval (drafters.hybrid."
                        "LookupHybrid, eval spec PATH+rest: rows whose last 2+ tokens occurred before copy what "
                        "followed; the others add what followed their last n-gram in ShareGPT to the drafter's tree)")
    p.add_argument("--dtype", default="bf16",
                   help="bf16 | fp32, the evaluation's target and drafter (default bf16: on a CPU with bf16 units a "
                        "pass verifying 5 draft tokens costs ~1.1x a one-token step in bf16 but 1.4-2x in fp32, see "
                        "BENCHMARKS.md; token-for-token exactness vs plain decoding is checked in fp32 only)")
    p.add_argument("--device", default=EVAL_DEFAULTS.device)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for training and evaluation (default: torch's; 1 on a busy machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (training, evaluation, model loading)")


def resolve_recipe(kind: str | None, recipe: str | None) -> tuple[str, Path]:
    """``(kind, recipe path)``; ``kind`` defaults per :func:`default_kind`.

    Raises:
        ValueError: no recipe for that kind (names the path and the ``--recipe`` fix).
    """
    kind = kind or default_kind()
    path = Path(recipe) if recipe else RECIPES_DIR / f"{kind}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.exists() else []
        raise ValueError(f"no recipe {path} for drafter kind {kind!r}; pass --recipe FILE.yaml or a --kind with a "
                         f"recipe in {RECIPES_DIR} (found: {have or 'none'})")
    return kind, path


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
    recipe = load_recipe(recipe_path, [f"output_dir={out / 'train'}", f"train.max_minutes={minutes}",
                                       *light_eval, *overrides])
    if resolve_dtype(recipe.target.dtype) != next(target.parameters()).dtype:
        # Train against the target in the recipe's dtype (bf16 halves the target forward on CPUs with
        # bf16 units); the caller's target (evaluation dtype) is left untouched.
        target, tok = load_target(EVAL_DEFAULTS.target, dtype=recipe.target.dtype,
                                  device=next(target.parameters()).device)
    result = train(recipe, target=target, tokenizer=tok, budget_start=budget_start)
    best, last = recipe.paths.best, recipe.paths.last
    saved = best if (best / "drafter" / "config.json").exists() or (best / "config.json").exists() else last
    # without mid-run picks the run's own last step is the one to measure (a run resumed in a used
    # --output-dir may hold an older best/ that its end-of-run score did not beat)
    ckpt = last if recipe.eval.every == 0 and last.exists() else saved
    summary = dict(recipe=str(recipe_path), kind=recipe.drafter.kind, output_dir=str(recipe.output_dir),
                   checkpoint=str(ckpt),
                   global_step=result.global_step, stopped=result.stopped, losses=result.losses,
                   final_loss=result.losses[-1] if result.losses else None, best_score=result.best_score,
                   in_loop_evals=result.evals)
    return ckpt, summary


def eval_config(ckpt: Path, args, bench: str, k: int):
    """The ``speceval.bench.EvalConfig`` of one benchmark, validated. Raises ``ValueError`` naming the bad flag."""
    try:
        thresholds = [float(x) for x in str(args.draft_thresholds).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--draft-threshold takes comma-separated numbers, got {args.draft_thresholds!r}") from None
    drafters = [str(ckpt)] if args.no_hybrid else [str(ckpt), f"{ckpt}+rest"]
    cfg = EvalConfig(drafters=drafters, benchmark=bench,
                     num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, k=k, dtype=args.dtype,
                     draft_thresholds=thresholds, trees=args.trees or list(DEFAULT_TREES),
                     device=args.device, progress=not args.no_progress,
                     baselines=[b for b in args.baselines.split(",") if b])
    cfg.validate()
    return cfg


def eval_stage(ckpt: Path, args, target, tok, k: int, datastore=None) -> dict:
    """``speceval.bench.evaluate`` of the checkpoint on each benchmark; returns ``{benchmark: record}``."""
    records = {}
    for bench in BENCHMARKS:
        records[bench] = evaluate(eval_config(ckpt, args, bench, k), target=target, tok=tok, datastore=datastore)
        print_record(records[bench])
    return records


def write_report(out: Path, report_data: dict) -> dict:
    """Write ``report.json``, ``report.md`` and the PNGs into ``out``; returns their paths."""
    pngs = [str(p) for p in plots.plot_eval_summary({b: r["summary"] for b, r in report_data["evals"].items()},
                                                     out)]
    if report_data["train"]["losses"]:
        pngs.append(str(plot_losses(report_data["train"]["losses"], out / "train_loss.png")))
    report_data["artifacts"] = dict(json=str(out / "report.json"), markdown=str(out / "report.md"), plots=pngs)
    lines = ["# drafterkit quickstart", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {secs:.1f} |" for name, secs in report_data["timings"].items()]
    tr = report_data["train"]
    lines += ["", f"Trained `{tr['kind']}` from `{tr['recipe']}`: {tr['global_step']} optimizer steps, stopped by "
              f"{tr['stopped']}, final loss {report.fmt(tr['final_loss'], '{:.4f}')}; "
              f"evaluated `{tr['checkpoint']}`.", ""]
    for bench, rec in report_data["evals"].items():
        lines.append(report.render_markdown(rec).replace("# drafterkit eval:", "## eval:", 1))
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    report.write_json(out / "report.json", report_data)
    return report_data["artifacts"]


def plot_losses(losses: list[float], path: Path) -> Path:
    """``train_loss.png``: the mean loss of every optimizer step."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    """Fetch, train, evaluate, report. Returns 0, or 2 on a usage / recipe error."""
    if args.minutes <= 0:  # the eval flags are checked below by the eval stage's own EvalConfig.validate
        print("drafterkit quickstart: error: --minutes must be > 0", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        report.disable_progress_bars()
    out = Path(args.output_dir)
    timings: dict[str, float] = {}
    try:
        kind, recipe_path = resolve_recipe(args.kind, args.recipe)
        k = load_recipe(recipe_path, ["output_dir=.", *args.overrides]).eval.k
        for bench in BENCHMARKS:  # the eval stage's settings, checked before a typo costs the training budget
            eval_config(out / "train", args, bench, k)
        out.mkdir(parents=True, exist_ok=True)  # only once every option is known good
        t0 = time.perf_counter()
        fetch_all()
        target, tok = load_target(EVAL_DEFAULTS.target, dtype=args.dtype, device=args.device)
        timings["fetch"] = time.perf_counter() - t0
        datastore = None
        if not args.no_hybrid:
            t0 = time.perf_counter()
            datastore = cached_datastore("sharegpt", tok, log=print)
            timings["datastore"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ckpt, train_summary = train_stage(recipe_path, kind, args.minutes, out, args.overrides, target, tok)
        timings["train"] = time.perf_counter() - t0
    except (ValueError, RecipeError, AssetError, FileNotFoundError) as exc:
        print(f"drafterkit quickstart: error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    evals = eval_stage(ckpt, args, target, tok, k, datastore)
    timings["eval"] = time.perf_counter() - t0
    paths = write_report(out, dict(timings=timings, train=train_summary, evals=evals))
    print(f"quickstart report: {paths['markdown']} ({', '.join(f'{n} {s:.0f}s' for n, s in timings.items())})")
    return 0
