"""DSpark, DFlash, P-EAGLE and EAGLE-3 trained for the same steps, measured side by side in one eval per benchmark.

    python benchmarks/parallel_side_by_side.py --runs runs/sbs --out runs/sbs/eval --threads 1

Training (done before, one ``drafterkit train`` per kind, see docs/benchmarks/parallel-drafters.md for the command
lines): ``RUNS/<kind>/checkpoints/last`` for each of :data:`KINDS` (``--checkpoint KIND=NAME``: its
``checkpoints/NAME`` instead, e.g. ``step-970`` of a longer run); a missing one stops the script.

Measurement: per benchmark ONE ``drafterkit eval`` with the four drafters ALONE, prompt lookup (``ngram``) and the
engine's plain decoding, on the questions the quickstart never measures
(``benchmarks.objective_ablation.unseen_prompt_files``: MT-bench's second question of each category, HumanEval
problems 8-15), chains of ``--k`` at every ``--draft-threshold`` (0: the whole chain, the shape vLLM serves; above
0: the chain stops once the drafter's path probability falls below it, drafterkit's engine only). Printed and
written to ``OUT/side-by-side.md``: per benchmark and row, tau, per-position acceptance, the drafter's milliseconds
per round (draft seconds / verification passes), tokens/s over plain decoding and over prompt lookup with paired
95% bootstrap intervals over the prompts (``speceval.factors.ratio_interval``); then each kind's best row (its
shape with the most tokens/s) per benchmark.

``--drop-prompts BENCHMARK:I,J`` leaves prompts I, J out of every row's tokens/s and speed ratios on that benchmark
(paired: the same prompts for every row; tau and acceptance keep every prompt): for a prompt whose timing a pause of
the process by other work corrupted (its wall time in ``per_prompt`` many times the other rows').
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.objective_ablation import unseen_prompt_files  # noqa: E402
from benchmarks.side_by_side import plain_row, spec_rows  # noqa: E402
from benchmarks.side_by_side import table as side_table  # noqa: E402

KINDS = ("dspark", "dflash", "peagle", "eagle3")


def measure(ckpts: dict[str, Path], prompts: Path, path: Path, args) -> dict:
    """One ``drafterkit eval`` of the four drafters + ngram + plain decoding; returns its JSON record."""
    if not path.exists():
        cmd = [sys.executable, "-m", "drafterkit.cli", "eval", "--benchmark", str(prompts),
               "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--k", str(args.k), "--draft-threshold", args.draft_threshold, "--dtype", args.dtype,
               "--baselines", "engine", "--output", str(path), "--no-progress", "--tree", "chain",
               *(["--threads", str(args.threads)] if args.threads else [])]
        for kind in KINDS:
            cmd += ["--drafter", str(ckpts[kind])]
        cmd += ["--drafter", "ngram"]
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit(f"eval failed; its output is above ({path})")
    return json.loads(path.read_text())


def named_rows(record: dict, thresholds: list[str]) -> list[tuple[str, dict]]:
    """``(name, row)`` of every speculative row: ``<kind>`` or ``<kind> @T`` in the order eval measured them
    (per drafter, its thresholds in the order given), then ``ngram``."""
    spec = spec_rows(record)
    names = [f"{kind}" + (f" @{t}" if float(t) else "") for kind in KINDS for t in thresholds] + ["ngram"]
    if len(spec) != len(names):
        raise SystemExit(f"expected {len(names)} speculative rows ({names}), the record holds {len(spec)}")
    return list(zip(names, spec))


def without_prompts(row: dict, drop: set[int]) -> dict:
    """``row`` with the prompts in ``drop`` left out of ``per_prompt`` and ``tokens_per_s`` (pooled tokens over
    pooled seconds, as eval computes it); the other fields as measured."""
    if not drop:
        return row
    kept = [p for p in row["per_prompt"] if p[0] not in drop]
    return {**row, "per_prompt": kept, "tokens_per_s": sum(p[1] for p in kept) / sum(p[2] for p in kept)}


def best_rows(rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Per kind, its row with the most tokens/s (its best measured shape here), then ``ngram``."""
    best = {}
    for name, row in rows:
        kind = name.split(" ")[0]
        if kind not in best or row["tokens_per_s"] > best[kind][1]["tokens_per_s"]:
            best[kind] = (name, row)
    return list(best.values())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, required=True, help="folder holding <kind>/checkpoints/last per kind")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--draft-threshold", default="0,0.1", help="comma-separated, each measured side by side")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--checkpoint", action="append", default=[], metavar="KIND=NAME",
                   help="measure RUNS/KIND/checkpoints/NAME instead of .../last")
    p.add_argument("--drop-prompts", action="append", default=[], metavar="BENCHMARK:I,J",
                   help="prompt indices left out of tokens/s on that benchmark (module docstring)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = dict(c.split("=", 1) for c in args.checkpoint)
    if unknown := sorted(set(names) - set(KINDS)):
        raise SystemExit(f"--checkpoint names kinds {unknown}; the kinds measured are {', '.join(KINDS)}")
    ckpts = {kind: args.runs / kind / "checkpoints" / names.get(kind, "last") for kind in KINDS}
    if missing := [str(c) for c in ckpts.values() if not c.is_dir()]:
        raise SystemExit(f"no trained drafter at {', '.join(missing)}; train each kind first (module docstring)")
    thresholds = args.draft_threshold.split(",")
    where = ", ".join(str(c) for c in ckpts.values())
    lines = [f"DSpark, DFlash, P-EAGLE, EAGLE-3 ({where}); chains of {args.k} at draft thresholds "
             f"{args.draft_threshold}; {args.num_prompts} unseen prompts x {args.max_new_tokens} new tokens, "
             f"{args.dtype}", ""]
    best = []
    drops = {b: {int(i) for i in idx.split(",")} for b, idx in (d.split(":") for d in args.drop_prompts)}
    for benchmark, prompts in unseen_prompt_files(args.out).items():
        record = measure(ckpts, prompts, args.out / f"eval-{benchmark}.json", args)
        drop = drops.get(benchmark, set())
        rows = [(name, without_prompts(row, drop)) for name, row in named_rows(record, thresholds)]
        plain = without_prompts(plain_row(record), drop)
        title = benchmark + (f" (tokens/s without prompts {sorted(drop)})" if drop else "")
        lines += side_table(title, rows, plain, rows[-1])
        best += side_table(f"{title}: each kind's best row", best_rows(rows), plain, rows[-1])
    text = "\n".join(lines + best)
    (args.out / "side-by-side.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
