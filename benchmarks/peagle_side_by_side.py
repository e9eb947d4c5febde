"""P-EAGLE against the EAGLE-3 head trained for the same CPU minutes, measured side by side in one run.

    python benchmarks/peagle_side_by_side.py --minutes 14.5 --out runs/peagle-vs-eagle3

Training: ``recipes/eagle3.yaml`` and ``recipes/peagle.yaml`` for ``--minutes`` each (the quickstart's training:
no evaluation inside training, ``data.feature_cache=off`` as the quickstart trains where no complete cache exists,
plus any ``--override``; ``--peagle-override`` applies to the P-EAGLE training only, e.g.
``drafter.options.num_layers=2``), one after the other, into ``OUT/eagle3`` and ``OUT/peagle``; a run whose
``checkpoints/last`` exists is not retrained, so a new P-EAGLE head is measured against an EAGLE-3 head trained
before by copying that run's ``eagle3`` folder into a new ``OUT``::

    mkdir -p runs/pe-layers && cp -r runs/pe145/eagle3 runs/pe-layers/
    python benchmarks/peagle_side_by_side.py --minutes 14.5 --threads 1 --out runs/pe-layers

Measurement: per benchmark ONE ``drafterkit eval`` with both heads ALONE (what ``drafterkit export`` ships),
prompt lookup (``ngram``) and the engine's plain decoding, on the questions the quickstart never measures
(``benchmarks.objective_ablation.unseen_prompt_files``: MT-bench's second question of each category, HumanEval
problems 8-15), chains of ``--k`` (the shape vLLM serves; ``--tree`` measures a static tree instead). Printed and
written to ``OUT/side-by-side.md``: per benchmark and head, tau, per-position acceptance, the head's drafting
milliseconds per round (draft seconds / verification passes), tokens/s over plain decoding and over prompt lookup
with paired 95% bootstrap intervals over the prompts (``speceval.factors.ratio_interval``), and whether the head
alone beats prompt lookup (the interval's lower end above 1).
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

KINDS = ("eagle3", "peagle")


def train_command(kind: str, out: Path, args) -> list[str]:
    """The ``drafterkit train`` command line of ``kind``'s run into ``out``: its shipped recipe, the budget, no
    evaluation, ``--override`` and, for ``peagle`` only, ``--peagle-override``."""
    budget = ([f"train.max_steps={args.steps}", "train.max_minutes=null"] if args.steps
              else ["train.max_steps=100000", f"train.max_minutes={args.minutes}"])
    return [sys.executable, "-m", "drafterkit.cli", "train", str(ROOT / "recipes" / f"{kind}.yaml"),
            f"output_dir={out}", *budget, "eval.every=0", "eval.at_end=false", "train.save_every=0",
            "data.feature_cache=off", "logging.trackers=[]", *args.override,
            *(args.peagle_override if kind == "peagle" else [])]


def train(kind: str, out: Path, args) -> Path:
    """Train ``recipes/<kind>.yaml`` for ``--minutes`` (or ``--steps``) into ``out``; skipped when done."""
    last = out / "checkpoints" / "last"
    if not last.is_dir():
        cmd = train_command(kind, out, args)
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit(f"training {kind} failed; its output is above")
    return last


def measure(ckpts: dict[str, Path], prompts: Path, path: Path, args) -> dict:
    """One ``drafterkit eval`` of both heads + ngram + plain decoding; returns its JSON record."""
    if not path.exists():
        cmd = [sys.executable, "-m", "drafterkit.cli", "eval", "--benchmark", str(prompts),
               "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--k", str(args.k), "--draft-threshold", "0", "--dtype", args.dtype, "--baselines", "engine",
               "--output", str(path), "--no-progress", "--tree", args.tree or "chain",
               *(["--threads", str(args.threads)] if args.threads else [])]
        for kind in KINDS:
            cmd += ["--drafter", str(ckpts[kind])]
        cmd += ["--drafter", "ngram"]
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit(f"eval failed; its output is above ({path})")
    return json.loads(path.read_text())


def table(record: dict, benchmark: str) -> list[str]:
    """Markdown lines for one benchmark's record: the two heads' rows (in --drafter order) and prompt lookup."""
    spec = spec_rows(record)
    ngram = ("ngram", spec[len(KINDS)])
    return side_table(benchmark, [*zip(KINDS, spec[:len(KINDS)]), ngram], plain_row(record), ngram)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=14.5, help="training minutes per head (the quickstart's)")
    p.add_argument("--steps", type=int, default=None, help="train this many steps instead (a check of the script)")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--tree", default=None, help="a static tree instead of chains of K (e.g. 3,2,1,1,1); without it "
                   "both heads draft chains of K, whatever a head's decoding.json records")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--override", action="append", default=[], help="recipe override for both trainings")
    p.add_argument("--peagle-override", action="append", default=[],
                   help="recipe override for the P-EAGLE training only (e.g. drafter.options.num_layers=2)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpts = {kind: train(kind, args.out / kind, args) for kind in KINDS}
    lines = [f"P-EAGLE vs EAGLE-3, {args.steps or args.minutes} {'steps' if args.steps else 'CPU minutes'} of "
             f"training each; chains of {args.k}" + (f", tree {args.tree}" if args.tree else "") +
             f"; {args.num_prompts} unseen prompts x {args.max_new_tokens} new tokens, {args.dtype}", ""]
    for benchmark, prompts in unseen_prompt_files(args.out).items():
        record = measure(ckpts, prompts, args.out / f"eval-{benchmark}.json", args)
        lines += table(record, benchmark)
    text = "\n".join(lines)
    (args.out / "side-by-side.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
