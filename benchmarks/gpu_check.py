"""The GPU check: the bundled speculative decoder's exactness, speed and cost model, and EAGLE-3 training
throughput, on random-weight targets of real shapes, in one run with no network.

On a lent GPU machine it runs inside ``scripts/gpu-run.sh`` (with the wheels it lacks, then
``scale_check.py``; docs/benchmarks/gpu.md). By itself, on a CUDA machine with drafterkit installed:

    PYTHONUNBUFFERED=1 python benchmarks/gpu_check.py --max-minutes 4 --json $OUT/gpu_check.json

Dry mode (tiny shapes, any device, under a minute on a 2-core CPU; the test suite runs it):

    python benchmarks/gpu_check.py --dry-run --json /tmp/gpu_check.json
    python benchmarks/gpu_check.py --dry-run --sections exact,cost

Targets are ``LlamaForCausalLM`` built from configs with seeded random weights (LM head x8, as the
tests' tiny models, so greedy argmaxes are not near-ties): SmolLM2-135M's shape (hidden 576, 30 layers,
9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings) and Llama-3.1-8B's (hidden
4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocabulary 128256), the latter in bf16.

Sections (``--sections``, default all, run in this order; one table at the end, the JSON rewritten
after every section so a run cut short keeps what it measured):

* ``exact``: speculative == plain greedy token for token in fp32 (TF32 off) on the SmolLM2-shaped
  target, two ragged prompts, for a self-draft (the target as its own draft model), a truncated draft
  LM (``DraftLM.from_target``), a random-weight EAGLE-3 head, and static trees ``3,2,1`` of the last two;
  then the chi-square test at temperature 1.0 (a 16-token-vocabulary target and a 1-layer draft model;
  3,000 rows of one ``generate`` call; the exact joint law of the first three tokens enumerated with
  full target forwards; Pearson chi-square with cells of expected count < 5 pooled, p-value from
  scipy's chi2, or from the same regularised incomplete gamma in torch where scipy is missing).
* ``cost``: verification cost of K = 1..8 draft tokens and of a 44-node tree relative to a plain step,
  and a self-draft's measured speedup against the ideal that cost model implies
  (``gpu_timing.cost_rows`` gives the formula).
* ``train``: EAGLE-3 training steps per second and peak memory on the 8B-shaped target
  (``gpu_train.train_rows``).
* ``speed``: batch 1 and 8, 256 new tokens after a 128-token prompt, bf16: the engine's plain
  decoding (``decode.generate(drafter=None)``) vs transformers ``generate`` vs ``generate`` with
  ``cache_implementation="static"`` (which transformers compiles with ``torch.compile`` on an
  accelerator); ms per token and the fraction of the memory-bandwidth floor (``gpu_timing.speed_rows``).
  Last: its compilations take the longest and vary the most, so ``--max-minutes`` cuts its rows rather
  than the fixed-size sections before it.

Timings are CUDA-synchronised wall times, warm-ups first, methods interleaved rep by rep, medians of
``--reps``. A unit that raises (an out-of-memory, a path that breaks on the device) becomes a failed row
with the error and the run goes on. Exit status 1 when an exactness row differs or fails, or a chi-square
p-value is below 1e-3.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# gpu_exact, gpu_timing, gpu_train beside this file. Not the checkout's root: its drafterkit/ folder holds only the
# CLI and would hide the installed package (drafterkit.decode and the others map onto the root's other folders).
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_exact import chi_square_rows, exact_rows  # noqa: E402
from gpu_timing import copy_bandwidth, cost_rows, speed_rows  # noqa: E402
from gpu_train import train_rows  # noqa: E402

SECTIONS = ("exact", "cost", "train", "speed")
SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=8192),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336, tie_word_embeddings=False,
                         rope_theta=500000.0, max_position_embeddings=131072),
}
DRY_SHAPES = {  # the same two layouts (tied / untied, GQA) at toy sizes
    "smollm2-135m": dict(vocab_size=256, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                         num_key_value_heads=1, intermediate_size=96, tie_word_embeddings=True,
                         max_position_embeddings=1024),
    "llama-3.1-8b": dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False,
                         max_position_embeddings=1024),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Targets:
    """Random-weight targets built once per (shape, dtype) on the device, seeded."""

    def __init__(self, device: torch.device, dry: bool):
        self.device, self.shapes, self.built = device, DRY_SHAPES if dry else SHAPES, {}

    def get(self, name: str, dtype: str):
        if (name, dtype) not in self.built:
            from transformers import LlamaConfig, LlamaForCausalLM

            cfg = LlamaConfig(**self.shapes[name], rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                              pad_token_id=0)
            torch.manual_seed(0)
            with torch.device(self.device):  # initialised on the device: an 8B CPU init takes minutes
                model = LlamaForCausalLM._from_config(cfg, dtype=DTYPES[dtype])
            model = model.to(self.device).eval().requires_grad_(False)
            with torch.no_grad():
                model.get_output_embeddings().weight.mul_(8.0)
            self.built[(name, dtype)] = model
        return self.built[(name, dtype)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes and sizes: checks the script, any device")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--json", type=Path, help="write every row here (rewritten after each section)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--models", default="llama-3.1-8b,smollm2-135m", help="speed section targets")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--compile-batches", default="1",
                   help="batches at which the static-cache + torch.compile row runs (each is one more compilation)")
    p.add_argument("--new-tokens", type=int, default=None, help="speed section (default 256; dry 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="speed section (default 128; dry 8)")
    p.add_argument("--reps", type=int, default=None, help="timed repeats per method (default 3; dry 1)")
    p.add_argument("--cost-models", default="llama-3.1-8b")
    p.add_argument("--cost-context", type=int, default=None, help="default 256; dry 16")
    p.add_argument("--cost-new-tokens", type=int, default=None, help="self-draft run (default 128; dry 8)")
    p.add_argument("--self-draft-k", type=int, default=4)
    p.add_argument("--train-batch", type=int, default=None, help="default 2; dry 2")
    p.add_argument("--train-seq", type=int, default=None, help="default 2048; dry 24")
    p.add_argument("--train-steps", type=int, default=None, help="timed steps (default 5; dry 1)")
    p.add_argument("--copy-mib", type=int, default=None, help="bandwidth probe buffer (default 2048; dry 16)")
    p.add_argument("--max-minutes", type=float, default=0.0,
                   help="skip (and list as skipped) work that would start after this many minutes; 0: no limit")
    a = p.parse_args(argv)
    real = {"new_tokens": 256, "prompt_len": 128, "reps": 3, "cost_context": 256, "cost_new_tokens": 128,
            "train_batch": 2, "train_seq": 2048, "train_steps": 5, "copy_mib": 2048}
    dry = {"new_tokens": 8, "prompt_len": 8, "reps": 1, "cost_context": 16, "cost_new_tokens": 8,
           "train_batch": 2, "train_seq": 24, "train_steps": 1, "copy_mib": 16}
    for k, v in (dry if a.dry_run else real).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    bad = [s for s in a.sections.split(",") if s not in SECTIONS]
    if bad:
        p.error(f"unknown sections {bad}; choose from {','.join(SECTIONS)}")
    bad = [m for m in (a.models + "," + a.cost_models).split(",") if m not in SHAPES]
    if bad:
        p.error(f"unknown target shapes {bad} in --models / --cost-models; choose from {','.join(SHAPES)}")
    return a


def _result(r: dict) -> str:
    """One table cell summarising a row."""
    if r.get("status") in ("failed", "skipped"):
        return f"{r['status'].upper()}: {r.get('error') or r.get('reason')}"
    s = r["section"]
    if s == "exact" and "p_value" in r:
        return f"p = {r['p_value']:.3g} ({'pass' if r['passed'] else 'FAIL'}; min of {len(r['p_values'])} tests)"
    if s == "exact":
        gap = None if r["identical"] else r["at_mismatch"]["top2_gap"]
        head = "identical" if r["identical"] else (f"DIFFERS (first at row, position {r['first_mismatch']}; "
                                                   f"the target's top-2 logit gap there {gap:.3g})")
        return f"{head}, {r['tokens']} tokens, tau {r['tau']:.2f}, acceptance {r['acceptance_rate']:.2f}"
    if s == "speed":
        extra = f", compiled: {r['compiled']}" if "compiled" in r else ""
        return (f"{r['ms_per_token']:.2f} ms/token, {r['tokens_per_s']:.0f} tok/s, {r['floor_fraction']:.3g} of the "
                f"bandwidth floor, time {r['time_vs_engine']:.2f}x the engine's{extra}")
    if s == "cost" and "measured_speedup" in r:
        return (f"measured {r['measured_speedup']:.2f}x plain, ideal {r['ideal_speedup']:.2f}x "
                f"({r['fraction_of_ideal']:.2f} of it), tau {r['tau']:.2f}")
    if s == "cost":
        return f"{r['relative_cost']:.2f}x a plain step ({1000 * r['median_s']:.2f} ms)"
    if s == "train":
        return (f"{r['steps_per_s']:.2f} steps/s, {r['tokens_per_s']:.0f} tok/s, peak {r['peak_memory_gib']:.2f} GiB "
                f"({r['peak_memory_kind']})")
    return ""


def print_table(rows: list[dict]) -> None:
    print("\n| section | case | result |\n|---|---|---|")
    for r in rows:
        print(f"| {r['section']} | {r['case']} | {_result(r)} |")


def run(a: argparse.Namespace) -> dict:
    """Run the selected sections; returns the report (also written to ``--json`` after each section)."""
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.dry_run and dev.type == "cpu":
        torch.set_num_threads(1)  # toy shapes gain nothing from threads, and a shared CPU makes them spin
    t0 = time.perf_counter()
    targets = Targets(dev, a.dry_run)
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "dry_run": a.dry_run, "args": {k: str(v) for k, v in vars(a).items()}, "rows": []}
    late = lambda: a.max_minutes and time.perf_counter() - t0 > 60 * a.max_minutes  # noqa: E731

    def add(rows):
        report["rows"] += rows
        for r in rows:
            print(f"[{time.perf_counter() - t0:6.1f}s] {r['section']} | {r['case']} | {_result(r)}")
        report["wall_s"] = time.perf_counter() - t0
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(report, indent=1, default=str))

    def unit(section: str, case: str, fn) -> None:
        """Run one unit of work: its rows, a skipped row past the time budget, or a failed row (never a crash)."""
        if late():
            reason = f"past --max-minutes {a.max_minutes}"
            add([{"section": section, "case": case, "status": "skipped", "reason": reason}])
            return
        try:
            add(fn())
        except Exception as e:  # an out-of-memory, a path that breaks on this device: a row, and the run goes on
            where = traceback.extract_tb(e.__traceback__)[-1]
            add([{"section": section, "case": case, "status": "failed", "error": f"{type(e).__name__}: "
                  f"{str(e).strip()[:300]} (at {Path(where.filename).name}:{where.lineno})"}])

    chosen = a.sections.split(",")
    if "exact" in chosen:
        unit("exact", "greedy fp32", lambda: exact_rows(targets.get("smollm2-135m", "fp32"), a.dry_run))
        unit("exact", "chi-square T=1.0", lambda: chi_square_rows(dev))
    if "speed" in chosen or "cost" in chosen:
        report["copy_bandwidth_gbps"] = copy_bandwidth(dev, a.copy_mib)
        print(f"copy bandwidth {report['copy_bandwidth_gbps']:.0f} GB/s ({a.copy_mib} MiB device-to-device)")
    if "cost" in chosen:
        for name in a.cost_models.split(","):
            unit("cost", name, lambda name=name: cost_rows(name, targets.get(name, "bf16"), a.cost_context,
                                                           a.cost_new_tokens, a.self_draft_k, a.reps))
    if "train" in chosen:
        unit("train", "llama-3.1-8b", lambda: train_rows("llama-3.1-8b", targets.get("llama-3.1-8b", "bf16"),
                                                         a.train_batch, a.train_seq, a.train_steps,
                                                         draft_vocab=64 if a.dry_run else 32000, ttt_steps=3))
    if "speed" in chosen:
        for b in [int(x) for x in a.batches.split(",")]:
            for name in a.models.split(","):
                unit("speed", f"{name} b{b}", lambda b=b, name=name: speed_rows(
                    name, targets.get(name, "bf16"), b, a.prompt_len, a.new_tokens, a.reps,
                    report["copy_bandwidth_gbps"], static=str(b) in a.compile_batches.split(",")))
    report["wall_s"] = time.perf_counter() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    threads = torch.get_num_threads()
    try:
        report = run(a)
    finally:
        torch.set_num_threads(threads)
    print_table(report["rows"])
    print(f"\n{report['device']}, torch {report['torch']}, transformers {report['transformers']}, "
          f"wall {report['wall_s']:.1f} s" + (f", JSON: {a.json}" if a.json else ""))
    bad = [r for r in report["rows"] if r["section"] == "exact"
           and (r.get("status") == "failed" or not (r.get("identical", True) and r.get("passed", True)))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
