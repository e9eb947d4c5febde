"""Which training objective buys the most acceptance: one recipe trained once per objective, every
drafter then measured side by side in ONE ``drafterkit eval`` run per benchmark and temperature.

    python benchmarks/objective_ablation.py recipes/eagle3.yaml --steps 300 --out runs/ablation-eagle3
    python benchmarks/objective_ablation.py recipes/draft_lm.yaml --objectives ce,fkl,accept_len --steps 150 \\
        --out runs/ablation-draft-lm
    python benchmarks/objective_ablation.py recipes/eagle3.yaml --minutes 6 --out runs/ablation-eagle3-time

Training: ``drafterkit train RECIPE`` with the objective's recipe overrides (below), ``train.max_steps``
= ``--steps`` (equal optimizer steps; the wall time of each run is recorded) or ``train.max_minutes`` =
``--minutes`` (equal wall time; the steps reached are recorded), no evaluation inside training, into
``OUT/<objective>/``. A run whose ``checkpoints/last`` already holds the asked steps is not retrained,
so an interrupted ablation continues where it stopped.

Measurement: for each benchmark and temperature, one ``drafterkit eval`` with every trained drafter, the
untrained prompt-lookup proposer (``ngram``) and the engine's plain decoding, on prompts the quickstart
never measures (MT-bench: the second question of each of the 8 categories; HumanEval: problems 8-15),
chain of ``--k`` draft tokens, bf16. Reported per objective: tau, per-position acceptance and tokens/s
over the engine's plain decoding measured in the same run. Writes ``OUT/ablation.json`` and
``OUT/ablation.md``.

Objectives (``--objectives``, comma-separated names; ``recipe`` keeps the recipe's own loss; every other name but
``dpace`` also sets ``loss.position_weights=fixed``, the kind's own decay, whatever the recipe weighs positions by):

| name | recipe overrides |
|---|---|
| ``ce`` | ``loss.name=ce loss.ce_labels=target`` (hard label: the target's argmax) |
| ``fkl`` / ``tvd`` / ``alpha`` / ``neg_log_alpha`` (LK-alpha) | ``loss.name=<name>`` at ``loss.temperature`` 1 |
| ``lk_lambda`` (LK-lambda) | ``loss.name=lk_lambda`` (``loss.lk_scale`` / ``lk_decay`` as the recipe sets) |
| ``accept_len`` | ``loss.name=accept_len`` over ``--draft-steps`` on the drafter's own drafts |
| ``dpace`` | ``ce`` with D-PACE's position weights (``loss.position_weights=dpace``) in place of the kind's decay |
| ``fkl+accept_len`` | ``loss.weights={fkl: 1, accept_len: 1}`` |
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SINGLE = ("ce", "fkl", "rkl", "tvd", "alpha", "neg_log_alpha", "lk_lambda", "accept_len")


def objective_overrides(name: str, kind: str, draft_steps: int) -> list[str]:
    """Recipe overrides that make ``name`` the training objective of a ``kind`` drafter.

    Raises:
        ValueError: an unknown objective name.
    """
    own = []
    if kind == "eagle3":
        own = ["drafter.options.ttt_tokens=draft"]  # accept_len needs the head's own drafts in its unroll
    elif kind == "eagle":
        own = [f"drafter.options.ttt_steps={draft_steps}"]
    fixed = "loss.position_weights=fixed"  # each kind's own decay, whatever the recipe weighs positions by
    if name == "recipe":
        return []
    if name == "ce":
        return ["loss.name=ce", "loss.ce_labels=target", "loss.weights=null", fixed]
    if name in SINGLE:
        extra = [f"loss.draft_steps={draft_steps}", *own] if name == "accept_len" else []
        return [f"loss.name={name}", "loss.weights=null", fixed, *extra]
    if name == "dpace":
        return ["loss.name=ce", "loss.ce_labels=target", "loss.weights=null", "loss.position_weights=dpace"]
    if name == "fkl+accept_len":
        return ["loss.weights={fkl: 1.0, accept_len: 1.0}", f"loss.draft_steps={draft_steps}", fixed, *own]
    raise ValueError(f"unknown objective {name!r}; choose from recipe, ce, {', '.join(SINGLE[1:])}, dpace, "
                     "fkl+accept_len")


def unseen_prompt_files(out: Path) -> dict[str, Path]:
    """JSONL prompt files of questions the quickstart never measures: MT-bench's second question of each
    category (first turns) and HumanEval problems 8-15 (with the eval's own code request)."""
    from drafterkit.speceval.prompts import HUMANEVAL_REQUEST
    from drafterkit.assets.prompt_files import load_humaneval, load_mt_bench

    by_cat: dict[str, list[dict]] = {}
    for q in load_mt_bench():
        by_cat.setdefault(q["category"], []).append(q)
    mt = [qs[1]["turns"][0] for qs in by_cat.values()]
    he = [HUMANEVAL_REQUEST.format(prompt=p["prompt"]) for p in load_humaneval()[8:16]]
    files = {}
    for name, prompts in (("mt-bench", mt), ("humaneval", he)):
        path = out / f"{name}-unseen.jsonl"
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        files[name] = path
    return files


def train_one(recipe: Path, name: str, out: Path, args, kind: str) -> dict:
    """Train ``name`` into ``out`` (skipped when already done); returns steps and wall seconds."""
    budget = ([f"train.max_steps={args.steps}", "train.max_minutes=null"] if args.minutes is None
              else ["train.max_steps=100000", f"train.max_minutes={args.minutes}"])
    over = [f"output_dir={out}", *budget, "eval.every=0", "eval.at_end=false", "train.save_every=0",
            "logging.trackers=[]", "train.resume=auto", *objective_overrides(name, kind, args.draft_steps),
            *args.override]
    done = out / "ablation-train.json"
    if done.exists():
        rec = json.loads(done.read_text())
        if rec.get("overrides") == over:
            return rec
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "drafterkit.train", str(recipe), *over], cwd=ROOT, text=True,
                          capture_output=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"training {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = {"objective": name, "overrides": over, "steps": summary["global_step"], "train_s": wall,
           "final_loss": summary["final_loss"], "drafter": str(out / "checkpoints" / "last" / "drafter")}
    done.write_text(json.dumps(rec, indent=1))
    return rec


def measure(runs: list[dict], bench: str, prompts: Path, temperature: float, out: Path, args) -> dict:
    """One ``drafterkit eval`` of every drafter + ngram + plain on ``prompts``; returns its JSON record."""
    path = out / f"eval-{bench}-T{temperature:g}.json"
    if not path.exists():
        cmd = [sys.executable, "-m", "drafterkit.cli", "eval", "--benchmark", str(prompts),
               "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--temperature", str(temperature), "--k", str(args.k), "--dtype", args.dtype,
               "--baselines", "engine", "--output", str(path), "--no-progress"]
        for r in runs:
            cmd += ["--drafter", r["drafter"]]
        cmd += ["--drafter", "ngram"]
        proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        if proc.returncode != 0:
            raise SystemExit(f"eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        print(proc.stdout)
    return json.loads(path.read_text())


def tau_counts(record: dict, method: str) -> dict[int, tuple[int, int]]:
    """prompt -> (committed tokens, verification passes) of ``method`` in an eval record (its tau per prompt)."""
    return {int(r["prompt"]): (r["stats"]["committed"], r["stats"]["target_forwards"]) for r in record["runs"]
            if r.get("method") == method and r.get("stats") and r.get("prompt") is not None}


def table(runs: list[dict], evals: dict[str, dict]) -> str:
    """Markdown: one row per objective (and ngram), per benchmark / temperature its tau, its tau over the first
    objective's and its tokens/s over plain decoding's, each ratio with its 95% interval from a paired bootstrap
    over the prompts (``speceval.factors.paired_interval``)."""
    from drafterkit.speceval.factors import interval_words, paired_interval, ratio_interval

    cols = list(evals)
    base = runs[0]["objective"] if runs else "-"
    head = "| objective | steps | train min | " + " | ".join(
        f"{c} tau | {c} tau / {base}'s | {c} x plain" for c in cols) + " | MT-bench T=0 per-position acceptance |"
    lines = [head, "|" + "---|" * (3 + 3 * len(cols) + 1)]
    names = [(r["objective"], r) for r in runs] + [("ngram (untrained)", None)]
    for i, (label, r) in enumerate(names):
        cells = [label, str(r["steps"]) if r else "-", f"{r['train_s'] / 60:.1f}" if r else "-"]
        pos = "-"
        for c in cols:
            spec = [s for s in evals[c]["summary"] if s["role"] == "spec"]  # in --drafter order
            row, plain = spec[i], next(s for s in evals[c]["summary"] if s["role"] == "plain")
            spread = ratio_interval(row, plain)
            mine, first = (tau_counts(evals[c], s["method"]) for s in (row, spec[0]))
            over = paired_interval(mine, first) if i else None
            cells += [f"{row['tau']:.3f}", f"{row['tau'] / spec[0]['tau']:.3f}x ({interval_words(over)})" if i else "-",
                      f"{row['speedup_vs_engine']:.2f}x" + (f" ({interval_words(spread)})" if spread else "")]
            if c.startswith("mt-bench") and c.endswith("T=0"):
                reached = row.get("reached_per_position") or [1] * len(row["accept_per_position"])
                pos = " ".join(f"{a:.2f}" if n else "-" for a, n in zip(row["accept_per_position"], reached))
        lines.append("| " + " | ".join(cells + [pos]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", type=Path)
    p.add_argument("--objectives", default="recipe,ce,fkl,tvd,neg_log_alpha,accept_len,fkl+accept_len")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per objective (equal steps)")
    p.add_argument("--minutes", type=float, default=None, help="equal wall time instead of equal steps")
    p.add_argument("--draft-steps", type=int, default=3, help="K of accept_len (and EAGLE-1's unroll)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--evals", default="mt-bench:0,humaneval:0,mt-bench:1,humaneval:1",
                   help="comma-separated BENCHMARK:TEMPERATURE pairs, each one drafterkit eval of every drafter")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--override", action="append", default=[], help="extra recipe override for every run")
    p.add_argument("--train-only", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    kind = yaml.safe_load(args.recipe.read_text())["drafter"]["kind"]
    names = [n.strip() for n in args.objectives.split(",") if n.strip()]
    for n in names:
        objective_overrides(n, kind, args.draft_steps)  # unknown names fail before any training
    runs = []
    for n in names:
        rec = train_one(args.recipe, n, args.out / n.replace("+", "_"), args, kind)
        print(f"{n}: {rec['steps']} steps in {rec['train_s'] / 60:.1f} min, final loss {rec['final_loss']}")
        runs.append(rec)
    if args.train_only:
        return 0
    files = unseen_prompt_files(args.out)
    evals = {}
    for pair in args.evals.split(","):
        bench, temp = pair.split(":")
        evals[f"{bench} T={float(temp):g}"] = measure(runs, bench, files[bench], float(temp), args.out, args)
    md = table(runs, evals)
    (args.out / "ablation.md").write_text(md + "\n")
    summaries = {k: v["summary"] for k, v in evals.items()}
    (args.out / "ablation.json").write_text(json.dumps({"runs": runs, "evals": summaries},
                                                       indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
