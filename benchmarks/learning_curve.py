"""What a recipe's drafter earns per training minute, against the untrained prompt-lookup proposer.

    python benchmarks/learning_curve.py recipes/eagle3.yaml --minutes 60 --every-steps 120 \\
        --budget 14.5 --out runs/curve-eagle3

Training (``python -m drafterkit.train RECIPE``, no evaluation inside training, ``data.feature_cache=off`` as the
quickstart trains where no complete cache exists, plus any ``--override``):

* the curve: one run of ``--minutes`` with a step checkpoint every ``--every-steps`` optimizer steps
  (``OUT/curve``). Its cosine schedule spans the whole run, so a mid-run checkpoint has not annealed;
  each checkpoint's ``trainer_state.json`` records the training seconds it had (``train_seconds``);
* each ``--budget`` (repeatable): a run of that many minutes with its own, fully annealed schedule
  (``OUT/budget-<minutes>``): ``--budget 14.5`` is the quickstart's training.

A run whose ``checkpoints/last`` already exists with the same overrides is not retrained, so an
interrupted curve continues where it stopped (``train.resume=auto``).

Measurement: ONE ``drafterkit eval`` with every checkpoint as a drafter ALONE (no prompt lookup, no
retrieval: what ``drafterkit export`` ships), the untrained prompt-lookup proposer ``ngram`` and the
engine's plain decoding, on questions the quickstart never measures (MT-bench: the second question of
each category, first turns; ``--benchmark humaneval``: problems 8-15), with the quickstart's decoding
settings (tree ``3,2,1,1,1``, confidence threshold 0.1: ``--tree`` / ``--draft-threshold`` / ``--k``). Printed
and written to ``OUT/curve-<benchmark>-<shape>@<threshold>-<dtype>.md`` / ``.json`` / ``.png`` (the eval
record beside them, ``eval-...json``, is reused when present): per checkpoint its minutes, steps,
tau and tokens/s over plain decoding, and the first minute at which the drafter alone beats ``ngram``
in tokens/s (or that it never did within the curve).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.objective_ablation import unseen_prompt_files  # noqa: E402


def train_run(recipe: Path, out: Path, minutes: float, every_steps: int, overrides: list[str]) -> dict:
    """Train ``recipe`` for ``minutes`` into ``out`` (skipped when already done with the same overrides)."""
    over = [f"output_dir={out}", "train.max_steps=100000", f"train.max_minutes={minutes}",
            f"train.save_every={every_steps}", "train.save_total_limit=null", "eval.every=0",
            "eval.at_end=false", "data.feature_cache=off", "logging.trackers=[]", "train.resume=auto",
            *overrides]
    done = out / "curve-train.json"
    if done.exists() and json.loads(done.read_text()).get("overrides") == over:
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "drafterkit.train", str(recipe), *over], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"training {out} failed ({proc.returncode}); its output is above")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = {"overrides": over, "minutes": minutes, "steps": summary["global_step"],
           "wall_s": time.perf_counter() - t0, "stopped": summary["stopped"]}
    done.write_text(json.dumps(rec, indent=1))
    return rec


def checkpoints(out: Path) -> list[dict]:
    """Step checkpoints and ``last/`` of one run, in step order, with their training seconds."""
    found = {}
    for ck in sorted((out / "checkpoints").iterdir()):
        state = ck / "trainer_state.json"
        if not state.is_file() or ck.name == "best":
            continue
        s = json.loads(state.read_text())
        if "train_seconds" not in s:
            raise SystemExit(f"{state} records no train_seconds (a checkpoint from an older drafterkit): "
                             f"delete {out} and rerun")
        found[s["global_step"]] = {"drafter": str(ck / "drafter"), "step": s["global_step"],
                                   "minutes": s["train_seconds"] / 60.0, "name": ck.name}
    return [found[k] for k in sorted(found)]


def eval_path(out: Path, args) -> Path:
    """The eval record of one setting: ``OUT/eval-<benchmark>-<shape>@<threshold>-<dtype>.json``."""
    shape = args.tree if args.tree != "chain" else f"chain{args.k}"
    return out / f"eval-{args.benchmark}-{shape}@{args.draft_threshold:g}-{args.dtype}.json"


def measure(points: list[dict], prompts: Path, out: Path, args) -> dict:
    """One ``drafterkit eval`` of every checkpoint + ngram + plain; returns its JSON record."""
    path = eval_path(out, args)
    if not path.exists():
        cmd = [sys.executable, "-m", "drafterkit.cli", "eval", "--benchmark", str(prompts),
               "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--tree", args.tree, "--k", str(args.k), "--draft-threshold", str(args.draft_threshold),
               "--dtype", args.dtype,
               "--baselines", "engine", "--output", str(path), "--no-progress"]
        for p in points:
            cmd += ["--drafter", p["drafter"]]
        cmd += ["--drafter", "ngram"]
        print(" ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"eval failed ({proc.returncode}); its output is above")
    return json.loads(path.read_text())


def attach(points: list[dict], record: dict) -> dict:
    """Add tau / speedup to each point from the eval record's spec rows (in --drafter order); returns
    the ngram row."""
    spec = [r for r in record["summary"] if r["role"] == "spec"]
    if len(spec) != len(points) + 1:
        raise SystemExit(f"the eval record holds {len(spec)} drafter rows, expected {len(points) + 1}")
    for p, row in zip(points, spec):
        p.update(tau=row["tau"], speedup=row["speedup_vs_engine"], tokens_per_s=row["tokens_per_s"])
    return spec[-1]


def table(points: list[dict], ngram: dict, plain_tps: float) -> str:
    lines = ["| run | checkpoint | training minutes | steps | tau | tokens/s | vs plain | vs ngram |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['run']} | {p['name']} | {p['minutes']:.1f} | {p['step']} | {p['tau']:.3f} | "
                     f"{p['tokens_per_s']:.2f} | {p['speedup']:.2f}x | "
                     f"{p['tokens_per_s'] / ngram['tokens_per_s']:.2f}x |")
    lines.append(f"| ngram (untrained) | - | - | - | {ngram['tau']:.3f} | {ngram['tokens_per_s']:.2f} | "
                 f"{ngram['speedup_vs_engine']:.2f}x | 1.00x |")
    lines.append(f"| plain decoding | - | - | - | 1.000 | {plain_tps:.2f} | 1.00x | |")
    return "\n".join(lines)


def crossing(points: list[dict], ngram: dict) -> str:
    curve = [p for p in points if p["run"] == "curve"]
    for p in curve:
        if p["tokens_per_s"] > ngram["tokens_per_s"]:
            return (f"the drafter alone first beats ngram in tokens/s at {p['minutes']:.1f} training minutes "
                    f"(step {p['step']}: {p['tokens_per_s'] / ngram['tokens_per_s']:.2f}x ngram)")
    last = curve[-1] if curve else None
    return ("the drafter alone does not beat ngram in tokens/s within the curve"
            + (f" (at {last['minutes']:.1f} min: {last['tokens_per_s'] / ngram['tokens_per_s']:.2f}x ngram, "
               f"tau {last['tau']:.3f} vs {ngram['tau']:.3f})" if last else ""))


def plot(points: list[dict], ngram: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, ref, label in ((axes[0], "tau", ngram["tau"], "acceptance length tau"),
                                (axes[1], "speedup", ngram["speedup_vs_engine"], "tokens/s over plain decoding")):
        curve = [p for p in points if p["run"] == "curve"]
        ax.plot([p["minutes"] for p in curve], [p[key] for p in curve], "o-", label="drafter alone (curve run)")
        for p in points:
            if p["run"] != "curve":
                ax.plot([p["minutes"]], [p[key]], "s", label=f"drafter alone ({p['run']}, annealed)")
        ax.axhline(ref, color="gray", linestyle="--", label="ngram (untrained)")
        ax.set_xlabel("training minutes")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", type=Path)
    p.add_argument("--minutes", type=float, default=60.0, help="length of the curve run")
    p.add_argument("--every-steps", type=int, default=120, help="a step checkpoint every N optimizer steps")
    p.add_argument("--budget", type=float, action="append", default=[],
                   help="also train a separate run of this many minutes (its own annealed schedule); repeatable")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--benchmark", default="mt-bench", choices=["mt-bench", "humaneval"])
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", default="3,2,1,1,1", help="the quickstart's draft tree (chain: a chain of --k)")
    p.add_argument("--k", type=int, default=5, help="draft tokens of a chain (--tree chain)")
    p.add_argument("--draft-threshold", type=float, default=0.1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--override", action="append", default=[], help="extra recipe override for every run")
    p.add_argument("--train-only", action="store_true")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.every_steps < 1 or any(b <= 0 for b in args.budget):
        p.error("--minutes and --budget must be > 0, --every-steps >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [("curve", args.out / "curve", args.minutes, args.every_steps)]
    runs += [(f"budget-{b:g}", args.out / f"budget-{b:g}", b, 0) for b in args.budget]
    points = []
    for name, out, minutes, every in runs:
        rec = train_run(args.recipe, out, minutes, every, args.override)
        print(f"{name}: {rec['steps']} steps, stopped by {rec['stopped']}", flush=True)
        for ck in checkpoints(out):
            if name == "curve" or ck["name"] == "last":
                points.append({**ck, "run": name})
    if args.train_only:
        return 0
    prompts = unseen_prompt_files(args.out)[args.benchmark]
    record = measure(points, prompts, args.out, args)
    ngram = attach(points, record)
    plain = next(r for r in record["summary"] if r["role"] == "plain")
    md = table(points, ngram, plain["tokens_per_s"]) + "\n\n" + crossing(points, ngram) + "\n"
    path = eval_path(args.out, args)
    stem = path.stem.replace("eval-", "curve-", 1)
    (args.out / f"{stem}.md").write_text(md)
    (args.out / f"{stem}.json").write_text(json.dumps({"points": points, "ngram": ngram, "plain": plain,
                                                       "eval": path.name}, indent=1))
    plot(points, ngram, args.out / f"{stem}.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
