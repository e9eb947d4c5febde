"""Issue 52's done-when check: an EAGLE-3 head trained from vLLM-regenerated data and vLLM-extracted features
against one trained from drafterkit's own data and features, at equal steps, measured on the same unseen
MT-bench prompts (docs/benchmarks/assets-and-data.md, "Trained from vLLM's data").

    nice -n 10 python benchmarks/vllm_data_parity.py --out runs/vllm-parity
    nice -n 10 python benchmarks/vllm_data_parity.py --out runs/vllm-parity --arms own     # one arm only (e.g.
    nice -n 10 python benchmarks/vllm_data_parity.py --out runs/vllm-parity --arms vllm    #   both in parallel)

Training (each arm, into ``OUT/<arm>/``): ``drafterkit train recipes/eagle3.yaml`` with the same first
``--examples`` ShareGPT examples regenerated greedily by the target (``data.regenerate=true``, up to
``--max-new`` tokens), the same seed, ``train.max_steps`` = ``--steps`` (no ``max_minutes``: the schedule does
not depend on timing) and the offline feature cache (``data.feature_cache=auto``; built before the first step,
since the run reads each example more than once). The arms differ only in the engines:

| arm | ``data.regenerate_engine`` | ``data.features_engine`` |
|---|---|---|
| ``own`` | ``drafterkit`` (``decode.generate``) | ``transformers`` (a transformers forward) |
| ``vllm`` | ``vllm`` (vLLM 0.32's ``LLM.generate``) | ``vllm`` (``extract_hidden_states``) |

An arm whose ``checkpoints/last`` already holds the steps is not retrained.

Agreement: both regenerated datasets (read back from their caches through ``train.recipe_data.load_data``
with each arm's saved recipe) compared example by example: identical responses, supervised tokens equal at
the same position, and supervised tokens before each response's first difference (the context both arms
train on alike).

Measurement: one ``drafterkit eval`` of both heads on MT-bench questions the quickstart never measures (the
2nd and 3rd question of each of the 8 categories, first turns: ``--prompts-per-category``), greedy, chain of
``--k`` draft tokens, bf16 target, ``--max-new-tokens`` each, no baselines (tau needs none). tau per head
pooled over the prompts (tokens committed per verification pass) with its 95% interval from a bootstrap over
the prompts, and the difference vLLM - own with its paired 95% interval. Writes ``OUT/parity.json`` and
``OUT/parity.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "eagle3.yaml"
ARMS = {"own": ["data.regenerate_engine=drafterkit", "data.features_engine=transformers"],
        "vllm": ["data.regenerate_engine=vllm", "data.features_engine=vllm"]}
DRAWS, SEED = 2000, 0  # bootstrap draws over the prompts and their seed


def overrides(arm: str, out: Path, args) -> list[str]:
    """The recipe overrides of one arm: everything equal but the two engines."""
    return [f"output_dir={out}", f"data.num_examples={args.examples}", f"data.max_length={args.max_length}",
            "data.regenerate=true", f"data.regenerate_max_new_tokens={args.max_new}",
            "data.feature_cache=auto", f"train.max_steps={args.steps}", "train.max_minutes=null",
            f"train.seed={args.seed}", "eval.every=0", "eval.at_end=false", "train.save_every=0",
            "logging.trackers=[]", "train.resume=auto", *ARMS[arm]]


def train_arm(arm: str, args) -> dict:
    """Train one arm into ``OUT/<arm>`` (skipped when done with the same overrides): steps, wall seconds."""
    out = args.out / arm
    over = overrides(arm, out, args)
    done = out / "parity-train.json"
    if done.exists() and json.loads(done.read_text()).get("overrides") == over:
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "drafterkit.train", str(RECIPE), *over], cwd=ROOT, text=True,
                          capture_output=True)
    wall = time.perf_counter() - t0
    (out / "train.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "train.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"training {arm} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = {"arm": arm, "overrides": over, "steps": summary["global_step"], "wall_s": round(wall, 1),
           "final_loss": summary["final_loss"], "drafter": str(out / "checkpoints" / "last" / "drafter")}
    done.write_text(json.dumps(rec, indent=1))
    return rec


def agreement(args) -> dict:
    """The two regenerations compared (module docstring), read back from their caches."""
    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.recipe_data import load_data

    data = {}
    for arm in ARMS:
        recipe = load_recipe(args.out / arm / "recipe.yaml")
        target, tok = load_target(recipe.target.name_or_path, dtype=recipe.target.dtype, device="cpu", chat=True)
        data[arm] = load_data(recipe, target, tok)
    own, vl = data["own"], data["vllm"]
    if len(own) != len(vl):
        raise SystemExit(f"the regenerations hold {len(own)} and {len(vl)} examples")
    same = equal = prefix = total_own = total_vllm = 0
    for a, b in zip(own, vl):
        ma, mb = list(a["loss_mask"]), list(b["loss_mask"])
        first = ma.index(1) if 1 in ma else len(ma)
        if a["input_ids"][:first] != b["input_ids"][:first] or mb.index(1) != first:
            raise SystemExit("the two regenerations answered different prompts")
        ra, rb = a["input_ids"][first:], b["input_ids"][first:]
        total_own, total_vllm = total_own + len(ra), total_vllm + len(rb)
        same += ra == rb
        equal += sum(x == y for x, y in zip(ra, rb))
        prefix += next((k for k, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb)))
    return {"examples": len(own), "identical_responses": same, "supervised_tokens_own": total_own,
            "supervised_tokens_vllm": total_vllm, "equal_at_same_position": equal,
            "before_first_difference": prefix}


def unseen_mt_bench(out: Path, per_category: int) -> Path:
    """A JSONL prompt file of MT-bench first turns the quickstart never measures: questions 2.. of each
    category (the quickstart's and training's evals take the first)."""
    from drafterkit.assets.prompt_files import load_mt_bench

    by_cat: dict[str, list[dict]] = {}
    for q in load_mt_bench():
        by_cat.setdefault(q["category"], []).append(q)
    prompts = [q["turns"][0] for qs in by_cat.values() for q in qs[1:1 + per_category]]
    path = out / "mt-bench-unseen.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def measure(runs: list[dict], args) -> dict:
    """One ``drafterkit eval`` of both heads (in arm order) on the unseen MT-bench prompts; its JSON record."""
    path = args.out / "eval-mt-bench.json"
    if not path.exists():
        prompts = unseen_mt_bench(args.out, args.prompts_per_category)
        cmd = [sys.executable, "-m", "drafterkit.cli", "eval", "--benchmark", str(prompts),
               "--num-prompts", str(8 * args.prompts_per_category), "--max-new-tokens", str(args.max_new_tokens),
               "--temperature", "0", "--k", str(args.k), "--dtype", "bf16", "--baselines", "", "--output", str(path),
               "--no-progress"]
        for r in runs:
            cmd += ["--drafter", r["drafter"]]
        proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        if proc.returncode != 0:
            raise SystemExit(f"eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        print(proc.stdout)
    return json.loads(path.read_text())


def per_prompt_counts(record: dict, method: str) -> dict[int, tuple[float, int]]:
    """prompt index -> (tokens committed by verification passes, passes) of one method's runs: tau pooled
    over prompts is the sum of the first over the sum of the second (``decode.metrics.pool_stats``)."""
    out: dict[int, list] = {}
    for r in record["runs"]:
        if r.get("stats") and r.get("prompt") is not None and r.get("method") == method:
            s = r["stats"]
            acc = out.setdefault(int(r["prompt"]), [0.0, 0])
            acc[0] += s["tau"] * s["target_forwards"]
            acc[1] += s["target_forwards"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def tau_intervals(a: dict, b: dict) -> dict:
    """tau of ``a`` and ``b`` (per-prompt counts) with 95% bootstrap intervals over the prompts both decoded,
    and ``b - a`` with its paired interval (the same prompts drawn for both)."""
    keys = sorted(set(a) & set(b))
    rng = random.Random(SEED)

    def tau(c, ks):
        return sum(c[k][0] for k in ks) / sum(c[k][1] for k in ks)

    ta, tb, diff = [], [], []
    for _ in range(DRAWS):
        ks = [rng.choice(keys) for _ in keys]
        ta.append(tau(a, ks))
        tb.append(tau(b, ks))
        diff.append(tb[-1] - ta[-1])

    def ci(xs):
        xs = sorted(xs)
        return [round(xs[int(0.025 * len(xs))], 3), round(xs[int(0.975 * len(xs)) - 1], 3)]

    return {"prompts": len(keys), "own": {"tau": round(tau(a, keys), 3), "ci95": ci(ta)},
            "vllm": {"tau": round(tau(b, keys), 3), "ci95": ci(tb)},
            "vllm_minus_own": {"tau": round(tau(b, keys) - tau(a, keys), 3), "ci95": ci(diff)}}


def table(runs: dict, taus: dict, agree: dict, record: dict) -> str:
    """Markdown: one row per arm, then the difference and the agreement of the regenerations."""
    rows = ["| arm | regenerated by | features by | steps | final loss | train wall min | MT-bench tau (95% interval) "
            "| per-position acceptance |", "|---|---|---|---|---|---|---|---|"]
    spec = [s for s in record["summary"] if s["role"] == "spec"]
    for (arm, r), s in zip(runs.items(), spec):
        eng = [o.split("=")[1] for o in ARMS[arm]]
        pos = " ".join(f"{x:.2f}" for x in s["accept_per_position"])
        t = taus[arm]
        rows.append(f"| {arm} | {eng[0]} | {eng[1]} | {r['steps']} | {r['final_loss']:.3f} | {r['wall_s'] / 60:.1f} "
                    f"| {t['tau']:.3f} ({t['ci95'][0]:.3f}-{t['ci95'][1]:.3f}) | {pos} |")
    d = taus["vllm_minus_own"]
    rows += ["", f"vLLM - own: tau {d['tau']:+.3f}, paired 95% interval {d['ci95'][0]:+.3f} to {d['ci95'][1]:+.3f} "
             f"over {taus['prompts']} prompts.", "",
             f"Regenerations: {agree['identical_responses']} of {agree['examples']} responses identical; "
             f"{agree['equal_at_same_position']:,} of {agree['supervised_tokens_own']:,} supervised tokens (own; "
             f"vLLM: {agree['supervised_tokens_vllm']:,}) equal at the same position, "
             f"{agree['before_first_difference']:,} before each response's first difference."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arms", default="own,vllm", help="comma-separated arms to train (the eval needs both)")
    p.add_argument("--examples", type=int, default=160, help="ShareGPT training examples (data.num_examples)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--max-new", type=int, default=128, help="data.regenerate_max_new_tokens")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps of each arm (equal steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128, help="eval: new tokens per answer")
    p.add_argument("--k", type=int, default=5)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    runs = {}
    for arm in arms:
        runs[arm] = train_arm(arm, args)
        print(f"{arm}: {runs[arm]['steps']} steps in {runs[arm]['wall_s'] / 60:.1f} min, "
              f"final loss {runs[arm]['final_loss']}", flush=True)
    if set(arms) != set(ARMS):
        return 0
    agree = agreement(args)
    record = measure([runs["own"], runs["vllm"]], args)
    spec = [s["method"] for s in record["summary"] if s["role"] == "spec"]  # in --drafter order: own, vllm
    counts = {arm: per_prompt_counts(record, method) for arm, method in zip(ARMS, spec)}
    taus = tau_intervals(counts["own"], counts["vllm"])
    md = table(runs, taus, agree, record)
    (args.out / "parity.md").write_text(md + "\n")
    (args.out / "parity.json").write_text(json.dumps({"runs": runs, "agreement": agree, "tau": taus}, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
