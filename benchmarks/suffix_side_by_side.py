"""Suffix decoding beside prompt lookup, retrieval and a trained head, each in its tuned shape, in one run.

    python benchmarks/suffix_side_by_side.py --head runs/qs/train/checkpoints/last --out runs/suffix-side-by-side

Tuning: ``drafterkit tune`` for each of ``ngram``, ``rest``, ``suffix`` (model-free: the record goes under
``$DRAFTERKIT_HOME``, keyed by the target), the head alone, the head behind lookup + retrieval (``HEAD+rest``)
and the head behind suffix decoding (``HEAD+suffix``; both recorded in the head's ``decoding.json``), on
held-out ShareGPT prompts (tune's default; never the prompts measured below), at batch size 1, in ``--dtype``.

Measurement: per benchmark ONE ``drafterkit eval --tree auto`` of the six rows and the engine's plain decoding,
interleaved prompt by prompt, on questions the quickstart never measures
(``benchmarks.objective_ablation.unseen_prompt_files``: MT-bench's second question of each category, HumanEval
problems 8-15). Printed and written to ``OUT/side-by-side.md``: per benchmark and row, its tuned shape, tau,
per-position acceptance, drafting milliseconds per verification pass, tokens/s over plain decoding and over prompt
lookup with paired 95% bootstrap intervals over the prompts. A stage whose output exists is not run again.
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
from benchmarks.side_by_side import plain_row, spec_rows, table  # noqa: E402

MODEL_FREE = ("ngram", "rest", "suffix")
BEHIND = ("", "+rest", "+suffix")


def drafterkit(*args: str) -> None:
    """Run one drafterkit command with this interpreter; stop with its output above on failure."""
    cmd = [sys.executable, "-m", "drafterkit.cli", *args]
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        raise SystemExit(f"failed: {' '.join(args[:2])}; its output is above")


def specs(head: Path) -> list[str]:
    """The six rows, model-free first (prompt lookup, the reference, first of all)."""
    return [*MODEL_FREE, *(f"{head}{b}" for b in BEHIND)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--head", type=Path, required=True, help="a trained drafter folder or checkpoint")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip-tune", action="store_true", help="use the tuned records already there")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--dtype", args.dtype, "--no-progress", *(["--threads", str(args.threads)] if args.threads else [])]
    rows = specs(args.head)
    if not args.skip_tune:
        for spec in rows:
            drafterkit("tune", spec, "--concurrency", "1", *common)
    lines = [f"Each row in its tuned shape (drafterkit tune, batch size 1, {args.dtype}); {args.num_prompts} unseen "
             f"prompts x {args.max_new_tokens} new tokens per benchmark", ""]
    for benchmark, prompts in unseen_prompt_files(args.out).items():
        path = args.out / f"eval-{benchmark}.json"
        if not path.exists():
            drafterkit("eval", "--benchmark", str(prompts), "--num-prompts", str(args.num_prompts),
                       "--max-new-tokens", str(args.max_new_tokens), "--tree", "auto", "--baselines", "engine",
                       "--output", str(path), *(a for s in rows for a in ("--drafter", s)), *common)
        record = json.loads(path.read_text())
        measured = spec_rows(record)
        names = [*MODEL_FREE, "head", "head+rest", "head+suffix"]
        lines += table(benchmark, list(zip(names, measured)), plain_row(record), ("ngram", measured[0]))
    text = "\n".join(lines)
    (args.out / "side-by-side.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
